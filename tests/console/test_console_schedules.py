"""The console's Schedules page against a real awp-server (in this process): every
schedule with its workflow, cadence, policies and next fire time, a paused one said so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from awp_db import schedules, workflows
from awp_db.connect import Pool
from console.test_console_http import _client, server, sign_in
from kit import ServerHandle, spec

__all__ = ["server"]  # the fixture, used by name


@pytest.fixture
async def browser(server: ServerHandle) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(server.address):
        yield client


async def test_the_schedules_page_lists_next_fire_times(
    browser: httpx.AsyncClient, pool: Pool
) -> None:
    await workflows.create(pool, spec("digest"))
    async with pool.acquire() as conn:
        for name, cron, interval, paused in (
            ("nightly", "0 2 * * *", 0, False),
            ("reindex", "", 900_000, True),
        ):
            await schedules.create(
                conn,
                schedules.ScheduleSpec(
                    name,
                    "digest",
                    0,
                    {},
                    cron,
                    interval,
                    "Europe/Paris",
                    "skip",
                    "all",
                    60_000,
                    paused,
                ),
                "test",
            )
    await sign_in(browser, "victor")
    answer = await browser.get("/schedules")
    assert answer.status_code == 200, answer.text
    text = answer.text
    assert 'aria-current="page">Schedules' in text
    assert "nightly" in text and "0 2 * * * (Europe/Paris)" in text
    assert "reindex" in text and "every 0:15:00" in text and "paused" in text
    row = text[text.index("<td>nightly</td>") : text.index("<td>reindex</td>")]
    assert ":00" in row and "paused" not in row  # a next fire time, not "paused"
