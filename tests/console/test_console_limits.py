"""The console's Limits page against a real awp-server (in this process): every rate limit
with its units, period and the units used now, and the ready tasks each rate limit and
concurrency key holds back now."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from awp_db import ratelimits
from awp_db.connect import Pool
from console.test_console_http import _client, server, sign_in
from kit import ServerHandle, flows, start_run
from kit.db import dispatch_all, register

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


async def test_the_limits_page_shows_what_each_limit_holds_back_now(
    browser: httpx.AsyncClient, pool: Pool
) -> None:
    keyed = flows.keyed("console-keyed", "acme", 3)
    rated = flows.rated("console-rated", "frozen-api", "1", 1)
    async with pool.acquire() as conn:
        await ratelimits.set_limit(conn, "frozen-api", 0, 60_000, "test")
        await ratelimits.set_limit(conn, "idle-api", 10, 60_000, "test")
    await start_run(pool, keyed)
    await start_run(pool, rated)
    await register(pool)
    # One task takes the key (max 1); the other two wait, as does the call with no unit free.
    assert await dispatch_all(pool) == 1
    await sign_in(browser, "victor")
    answer = await browser.get("/limits")
    assert answer.status_code == 200, answer.text
    text = answer.text
    assert "<th>waiting now</th>" in text
    rows = re.findall(r"<tr>\s*<td>([\w.:-]+)</td>.*?</tr>", text, re.DOTALL)
    assert rows == ["frozen-api", "idle-api", "acme"]
    assert re.search(r'<td>frozen-api</td>.*?<td class="num waiting">1</td>', text, re.DOTALL)
    assert re.search(r'<td>idle-api</td>.*?<td class="num waiting">0</td>', text, re.DOTALL)
    keys = text[text.index('id="keys-waiting"') :]
    assert re.search(r'<td>acme</td>\s*<td class="num waiting">2</td>', keys)
    assert "awp_limit_throttled_seconds_total" in text
