"""The run page's trace id, its link to the user's tracing UI, and the timeline of
attempts per task through a worker's death (docs/observability.md). The timeline's
screenshot is the one docs/observability.md shows (tests/artifacts/console/<test>/)."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page, expect

from awp.v1 import runs_pb2, types_pb2
from awp_protocol.jsonvalue import dict_to_struct
from console.conftest import Shot
from console.stack import TRACE_URL, ConsoleStack, auth
from console.test_console_browser import sign_in
from kit import poll_until

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


async def test_the_run_page_links_its_trace_and_draws_each_task_s_attempts(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path, artifacts: Path
) -> None:
    await stack.apply(
        "console-timeline",
        [
            ("fetch", "console.fetch", []),
            ("hold", "console.gate", ["fetch"]),
            ("publish", "console.gate", ["hold"]),
        ],
        attempts=2,
    )
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "publish").touch()
    # The caller traces: its traceparent travels with StartRun, and the run keeps it.
    async with stack.channel() as channel:
        answer = await stack.control(channel).StartRun(
            runs_pb2.StartRunRequest(
                workflow_name="console-timeline", input=dict_to_struct({"gates": str(gates)})
            ),
            metadata=(*auth("root"), ("traceparent", TRACEPARENT)),
            timeout=10,
        )
    run_id = answer.run.id
    assert answer.run.trace_id == CALLER_TRACE

    async def hold_running(attempts: int) -> bool:
        tasks = {t.key: t for t in (await stack.get_run(run_id)).tasks}
        hold = tasks["hold"]
        return hold.attempts == attempts and hold.state == types_pb2.TASK_STATE_RUNNING

    await poll_until(lambda: hold_running(1), "hold's first attempt", within=30)
    worker = stack.worker
    assert worker is not None
    worker.kill()  # kill -9: its lease expires, the task runs again
    worker.spawn()
    await stack.workers_registered()
    await poll_until(lambda: hold_running(2), "hold's second attempt", within=60)
    (gates / "hold").touch()
    await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)

    await sign_in(page, stack, "root", f"/runs/{run_id}")
    await expect(page.locator("#trace-id")).to_have_text(CALLER_TRACE)
    link = TRACE_URL.replace("{trace_id}", CALLER_TRACE)
    await expect(page.locator("#trace-link")).to_have_attribute("href", link)
    timeline = page.locator("#timeline")
    await expect(timeline.locator("g[data-state=interrupted]")).to_have_count(1)
    await expect(timeline.locator("g[data-state=succeeded]")).to_have_count(3)
    await expect(timeline.locator("g[data-state=interrupted] title")).to_contain_text(
        "hold attempt 1 on console-test-worker: interrupted"
    )
    await timeline.scroll_into_view_if_needed()
    await timeline.screenshot(path=artifacts / "timeline.png")
    await shot(page, "run-with-timeline")
