"""The Limits page in a real browser (Debian's Chromium against real processes): a full
concurrency key and a rate limit with no unit free show the ready tasks they hold back
now. Waits are polls with a deadline (kit.poll_until, Playwright's expect), never a sleep."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from google.protobuf import duration_pb2
from playwright.async_api import Page, expect

from awp.v1 import limits_pb2, types_pb2
from console.conftest import Shot
from console.stack import WAIT_MS, ConsoleStack
from console.test_console_browser import sign_in
from console.test_console_watching import _create, _task
from kit import poll_until

KEYED: Final = "console-keyed"
RATED: Final = "console-rated"


async def _set_limit(stack: ConsoleStack, name: str, units: int) -> None:
    spec = limits_pb2.RateLimitSpec(
        name=name, units=units, period=duration_pb2.Duration(seconds=60)
    )
    await stack.call("SetRateLimit", limits_pb2.SetRateLimitRequest(spec=spec))


async def test_the_limits_page_shows_the_tasks_each_limit_holds_back(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    await _set_limit(stack, "frozen-api", 0)
    await _create(
        stack,
        KEYED,
        [
            _task(
                "hold",
                "console.gate",
                [],
                concurrency_limits=[limits_pb2.ConcurrencyLimit(key="acme", max=1)],
            )
        ],
    )
    await _create(
        stack,
        RATED,
        [
            _task(
                "call",
                "console.fetch",
                [],
                rate_limits=[limits_pb2.RateUse(limit="frozen-api", units="1")],
            )
        ],
    )
    gates = tmp_path / "gates"
    gates.mkdir()
    keyed = [await stack.start_run(KEYED, {"gates": str(gates)}) for _ in range(3)]
    rated = await stack.start_run(RATED, {})

    async def held_back() -> bool:
        answer = await stack.call("ListRateLimits", limits_pb2.ListRateLimitsRequest())
        keys = [(w.name, w.waiting) for w in answer.keys_waiting]
        return keys == [("acme", 2)]

    # One run's task takes the key once the coordinator grants it; the other two wait.
    await poll_until(held_back, "the key acme to hold back two tasks", within=WAIT_MS / 1000)
    await sign_in(page, stack, "victor", "/limits")
    frozen = page.locator("#limits tr", has_text="frozen-api")
    await expect(frozen.locator("td.waiting")).to_have_text("1")
    acme = page.locator("#keys-waiting tr", has_text="acme")
    await expect(acme.locator("td.waiting")).to_have_text("2")
    await expect(page.locator("#throttled-note")).to_contain_text(
        "awp_limit_throttled_seconds_total"
    )
    await shot(page, "limits-waiting")
    # Let everything go: the gates open, the limit gets units.
    (gates / "hold").touch()
    await _set_limit(stack, "frozen-api", 10)
    for run_id in [*keyed, rated]:
        await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)
    await page.reload()
    await expect(page.locator("#keys-waiting")).to_contain_text("No concurrency key holds back")
    await expect(frozen.locator("td.waiting")).to_have_text("0")
