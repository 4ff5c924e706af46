"""Step memos in the console, in a real browser against real processes (as
test_console_browser): what the memos of a retried task saved shows on the run's header
and in the task's panel."""

from __future__ import annotations

from typing import Final

from playwright.async_api import Page, expect

from awp.v1 import types_pb2
from console.conftest import Shot
from console.stack import ConsoleStack
from console.test_console_browser import sign_in

AGENT: Final = "console-agent"


async def test_what_step_memos_saved_shows_on_the_run_and_its_task(
    page: Page, stack: ConsoleStack, shot: Shot
) -> None:
    await stack.apply(AGENT, [("write", "console.agent", [])], attempts=2)
    run_id = await stack.start_run(AGENT, {})
    await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await expect(page.locator("#run-savings")).to_have_text(
        "2 steps not run again, 1,000 tokens, $0.5000"
    )
    await page.click('svg.dag [data-key="write"]')
    await expect(page.locator("#memo-savings")).to_have_text(
        "2 steps not run again, 1,000 tokens, $0.5000"
    )
    await shot(page, "memo-savings")
