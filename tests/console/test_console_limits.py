"""The console's Limits page against a real awp-server (in this process): every rate limit
with its units, period and the units used now."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from awp_db import ratelimits
from awp_db.connect import Pool
from console.test_console_http import _client, server, sign_in
from kit import ServerHandle

__all__ = ["server"]  # the fixture, used by name


@pytest.fixture
async def browser(server: ServerHandle) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(server.address):
        yield client


async def test_the_limits_page_lists_each_limit_and_its_use(
    browser: httpx.AsyncClient, pool: Pool
) -> None:
    await sign_in(browser, "victor")
    empty = await browser.get("/limits")
    assert empty.status_code == 200, empty.text
    assert "No rate limit" in empty.text
    async with pool.acquire() as conn:
        await ratelimits.set_limit(conn, "openai-tpm", 90_000, 60_000, "test")
    answer = await browser.get("/limits")
    assert answer.status_code == 200, answer.text
    text = answer.text
    assert 'aria-current="page">Limits' in text
    row = text[text.index("<td>openai-tpm</td>") :]
    assert "90,000" in row and "0:01:00" in row and "<td>0</td>" in row
