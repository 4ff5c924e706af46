"""The console in a real browser (Debian's Chromium, driven by Playwright) against real
awp-server, awp-coordinator, awp-worker and `awp console` processes with credentials on.

Every wait is Playwright's: `expect(...)` re-checks until its timeout, which is a poll
with a deadline, never a sleep. Screenshots of each step are kept (conftest).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import grpc
import pytest
from playwright.async_api import Page, expect

from awp.v1 import control_pb2, runs_pb2, types_pb2
from awp_protocol.errors import Reason, decode_details
from console.conftest import Shot
from console.stack import TOKENS, ConsoleStack
from kit import poll_until

GATED: Final = "console-gated"
FRAGILE: Final = "console-fragile"
TALK: Final = "console-talk"


@pytest.fixture(scope="module", autouse=True)
async def workflows(stack: ConsoleStack) -> None:
    await stack.apply(
        GATED,
        [("a", "console.gate", []), ("b", "console.gate", ["a"]), ("c", "console.gate", ["b"])],
    )
    await stack.apply(TALK, [("say", "console.talk", [])])
    await stack.apply(
        FRAGILE,
        [
            ("fetch", "console.fetch", []),
            ("parse", "console.parse", ["fetch"]),
            ("publish", "console.fetch", ["parse"]),
        ],
    )


async def sign_in(page: Page, stack: ConsoleStack, user: str, path: str = "/") -> None:
    await page.goto(stack.url + path)
    await expect(page).to_have_url(re.compile(r"/login\?next="))
    await page.fill("#token", TOKENS[user])
    await page.click("#sign-in")
    await expect(page.locator("#who-name")).to_have_text(user)
    await scripts_ready(page)


async def scripts_ready(page: Page) -> None:
    """Once the page shown has run its scripts: its graph, list and panel are drawn by
    the HTML first and listen to clicks only once the deferred scripts have run, so a
    click on a loaded machine could land before them and be lost."""
    await page.wait_for_load_state("load")


async def gated_run(stack: ConsoleStack, tmp_path: Path) -> tuple[str, Path]:
    gates = tmp_path / "gates"
    gates.mkdir()
    return await stack.start_run(GATED, {"gates": str(gates)}), gates


async def failed_run(stack: ConsoleStack, tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "fail"
    marker.touch()
    run_id = await stack.start_run(FRAGILE, {"fail_marker": str(marker)})
    await stack.wait_run(run_id, types_pb2.RUN_STATE_FAILED)
    return run_id, marker


def node(page: Page, key: str) -> object:
    return page.locator(f'svg.dag [data-key="{key}"]')


async def fill_of(page: Page, key: str) -> str:
    fill: str = await page.locator(f'svg.dag [data-key="{key}"] .box').evaluate(
        "box => getComputedStyle(box).fill"
    )
    return fill


async def test_a_run_s_nodes_change_colour_live_as_tasks_finish(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, gates = await gated_run(stack, tmp_path)
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    a, b = page.locator('svg.dag [data-key="a"]'), page.locator('svg.dag [data-key="b"]')
    await expect(a).to_have_class(re.compile(r"\bs-running\b"))
    await expect(b).to_have_class(re.compile(r"\bs-pending\b"))
    running = await fill_of(page, "a")
    await shot(page, "run-a-running")
    # A mark on this document: gone if anything reloaded the page.
    await page.evaluate("window.sameDocument = true")
    (gates / "a").touch()
    await expect(a).to_have_class(re.compile(r"\bs-succeeded\b"))
    await expect(b).to_have_class(re.compile(r"\bs-running\b"))
    assert await fill_of(page, "a") != running
    assert await fill_of(page, "b") == running
    await expect(page.locator(".vrow", has_text="a").first).to_contain_text("succeeded")
    await shot(page, "run-a-succeeded-b-running")
    (gates / "b").touch()
    (gates / "c").touch()
    await expect(page.locator("#run-state")).to_have_text("succeeded")
    await expect(page.locator("#live-status")).to_contain_text("ended")
    await expect(page.locator('svg.dag [data-key="c"]')).to_have_class(re.compile("s-succeeded"))
    assert await page.evaluate("window.sameDocument") is True
    await shot(page, "run-succeeded")


async def test_a_failed_task_shows_its_traceback(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, _ = await failed_run(stack, tmp_path)
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await expect(page.locator('svg.dag [data-key="parse"]')).to_have_class(re.compile("s-failed"))
    await expect(page.locator('svg.dag [data-key="publish"]')).to_have_class(
        re.compile("s-skipped")
    )
    await page.click('svg.dag [data-key="parse"]')
    await expect(page.locator("#task-error")).to_contain_text(
        "ValueError: record has no field 'missing'"
    )
    traceback = page.locator("#task-traceback")
    await expect(traceback).to_contain_text("in parse")
    await expect(traceback).to_contain_text("in read_field")
    await expect(page.locator("#task-attempts")).to_contain_text("console-test-worker")
    await expect(page.locator("#task-attempts")).to_contain_text("failed")
    await page.click("#task-attempts summary:text('log tail')")
    await expect(page.locator("#task-attempts pre.log")).to_contain_text("parsing 3 records")
    await shot(page, "failed-task-traceback")


async def test_a_task_s_output_streams_into_its_panel_as_it_is_written(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    run_id = await stack.start_run(TALK, {"gates": str(gates)})
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await page.click('svg.dag [data-key="say"]')
    text = page.locator('#task-stream pre.stream-attempt[data-attempt="1"]')
    await expect(text).to_contain_text("word0 word1 word2")
    # Still growing while the task runs: the text arrives live, not on a reload.
    await expect(text).to_contain_text("word6")
    await expect(page.locator("#task-stream-status")).to_have_text("live")
    await shot(page, "task-stream-live")
    (gates / "say").touch()
    await expect(text).to_contain_text("the end.")
    await expect(page.locator("#task-stream-status")).to_have_text("ended")
    await expect(text).to_have_attribute("data-state", "succeeded")
    words = (await text.text_content() or "").split()
    # Every word once, in order: no chunk lost or repeated on the way to the page.
    assert words[-2:] == ["the", "end."]
    assert words[:-2] == [f"word{i}" for i in range(len(words) - 2)]
    await shot(page, "task-stream-ended")


async def test_cancel_from_the_page_is_recorded_with_the_user(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, _ = await gated_run(stack, tmp_path)
    await sign_in(page, stack, "alice", f"/runs/{run_id}")
    await expect(page.locator('svg.dag [data-key="a"]')).to_have_class(re.compile("s-running"))
    await page.click("#cancel-run")
    await page.fill("#cancel-form input[name=reason]", "not needed any more")
    await shot(page, "cancel-confirm")
    await page.click("#confirm-cancel")
    await expect(page.locator("#canceled-by")).to_have_text("alice")
    await expect(page.locator("#run-state")).to_have_text("canceled")
    await expect(page.locator('svg.dag [data-key="a"]')).to_have_class(re.compile("s-canceled"))
    await shot(page, "canceled")
    run = (await stack.get_run(run_id)).run
    assert (run.state, run.cancel_requested_by) == (types_pb2.RUN_STATE_CANCELED, "alice")


async def test_retry_from_failure_on_the_page_starts_a_run_by_the_user(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, marker = await failed_run(stack, tmp_path)
    marker.unlink()
    await sign_in(page, stack, "alice", f"/runs/{run_id}")
    await page.click("#retry-run")
    await expect(page).not_to_have_url(re.compile(re.escape(run_id)))
    await expect(page.locator("#retried-from")).to_have_text(run_id)
    await expect(page.locator("#started-by")).to_have_text("alice")
    await expect(page.locator("#run-state")).to_have_text("succeeded")
    await page.click('svg.dag [data-key="fetch"]')
    await expect(page.locator(".task-detail")).to_contain_text("not run again")
    await shot(page, "retried-and-succeeded")
    new_id = page.url.rsplit("/", 1)[-1]
    run = (await stack.get_run(new_id)).run
    assert (run.started_by, run.retried_from_run_id) == ("alice", run_id)


async def test_a_viewer_sees_no_cancel_button_and_a_forged_cancel_is_refused(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, gates = await gated_run(stack, tmp_path)
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await expect(page.locator('svg.dag [data-key="a"]')).to_have_class(re.compile("s-running"))
    await expect(page.locator("#cancel-run")).to_have_count(0)
    await page.click('svg.dag [data-key="a"]')
    await expect(page.locator(".task-detail")).to_be_visible()
    await expect(page.locator("#retry-from-task")).to_have_count(0)
    await shot(page, "viewer-run-page")
    # The viewer forges the cancel with its own session and its own form token: the
    # console refuses it for the role...
    csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
    forged = await page.request.post(
        f"{stack.url}/runs/{run_id}/cancel",
        form={"csrf": csrf or ""},
        headers={"origin": stack.url},
    )
    assert forged.status == 403
    assert "may not call CancelRun" in await forged.text()
    # ...and awp-server refuses the viewer's credential on its own.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.call("CancelRun", runs_pb2.CancelRunRequest(run_id=run_id), "victor")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    reason = decode_details(refused.value.trailing_metadata()).reason
    assert reason == Reason.PERMISSION_DENIED
    assert not (await stack.get_run(run_id)).run.HasField("cancel_requested_at")
    for gate in "abc":
        (gates / gate).touch()
    await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)


async def test_with_credentials_on_the_console_asks_for_a_token(
    page: Page, stack: ConsoleStack, shot: Shot
) -> None:
    await page.goto(stack.url + "/workers")
    await expect(page).to_have_url(re.compile(r"/login\?next=/workers$"))
    await shot(page, "login")
    await page.fill("#token", "not-a-token")
    await page.click("#sign-in")
    await expect(page.locator("#login-problem")).to_contain_text("does not know this token")
    await page.fill("#token", TOKENS["alice"])
    await page.click("#sign-in")
    await expect(page).to_have_url(re.compile(r"/workers$"))
    await expect(page.locator("#who-name")).to_have_text("alice")
    cookies = await page.context.cookies()
    (session,) = [c for c in cookies if c["name"] == "awp_console_session"]
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict"
    assert TOKENS["alice"] not in session["value"]
    await page.click("#sign-out")
    await expect(page).to_have_url(re.compile(r"/login"))
    await page.goto(stack.url + "/runs")
    await expect(page).to_have_url(re.compile(r"/login\?next=/runs$"))


async def test_every_page_renders(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    run_id, _ = await failed_run(stack, tmp_path)
    await sign_in(page, stack, "root")
    await expect(page.locator("#reliability")).to_contain_text("late results rejected")
    await expect(page.locator("#queue, p:text('Nothing queued.')").first).to_be_visible()
    await shot(page, "overview")
    await page.click("nav >> text=Runs")
    await expect(page.locator("#runs tbody tr").first).to_be_visible()
    await page.select_option("#state-filter", "failed")
    await page.click("#run-filters button")
    await expect(page.locator("#runs tbody tr").first).to_contain_text("failed")
    await shot(page, "runs")
    await page.goto(f"{stack.url}/runs/{run_id}")
    await page.click("#load-attempts")
    await expect(page.locator("#attempts table")).to_contain_text("console-test-worker")
    await shot(page, "run")
    await page.click("nav >> text=Workflows")
    await expect(page.locator("#workflows")).to_contain_text(GATED)
    await shot(page, "workflows")
    await page.click(f"#workflows >> text={FRAGILE}")
    await expect(page.locator("#workflow-tasks")).to_contain_text("console.parse")
    await expect(page.locator("svg.dag [data-key]")).to_have_count(3)
    await shot(page, "workflow")
    await page.click("nav >> text=Workers")
    await expect(page.locator("#workers")).to_contain_text("console-test-worker")
    await shot(page, "workers")


async def test_a_run_of_5000_tasks_opens_clustered_and_follows_live(
    page: Page, stack: ConsoleStack, shot: Shot
) -> None:
    # 50 chains of 100 mock tasks: too many nodes to draw one by one.
    chains, length = 50, 100
    definition = types_pb2.WorkflowDefinition(
        name="console-big",
        version=1,
        tasks=[
            types_pb2.TaskDefinition(
                key=f"c{c:02d}-{i:03d}",
                executor_kind="mock",
                action="noop",
                depends_on=[f"c{c:02d}-{i - 1:03d}"] if i else [],
            )
            for c in range(chains)
            for i in range(length)
        ],
    )
    await stack.call("CreateWorkflow", control_pb2.CreateWorkflowRequest(definition=definition))
    await sign_in(page, stack, "victor")
    run_id = await stack.start_run("console-big", {})
    await page.goto(f"{stack.url}/runs/{run_id}")
    await expect(page.locator("html[data-run-page=ready]")).to_have_count(1)
    drawn = await page.locator("svg.dag [data-node]").count()
    assert 0 < drawn <= 300
    await expect(page.locator("#graph-note")).to_contain_text("of 5000 tasks")
    await expect(page.locator("#task-count")).to_have_text("5000 of 5000")
    # Virtualised: only the rows in view (and a margin) exist.
    assert await page.locator("#task-list .vrow").count() < 60
    await shot(page, "big-run-opened")
    await expect(page.locator("#run-state")).to_have_text("succeeded", timeout=180_000)
    await expect(page.locator("#run-progress .counts")).to_have_text("5000 succeeded")
    await page.locator("svg.dag [data-node]").first.click()
    await expect(page.locator("#task-group-filter")).to_be_visible()
    await page.select_option("#task-state-filter", "succeeded")
    await page.fill("#task-filter", "c07-")
    await expect(page.locator("#task-count")).not_to_have_text("5000 of 5000")
    await shot(page, "big-run-succeeded")


async def test_a_worker_s_death_shows_in_the_reliability_figures(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    await stack.apply("console-sturdy", [("hold", "console.gate", [])], attempts=2)
    gates = tmp_path / "gates"
    gates.mkdir()
    run_id = await stack.start_run("console-sturdy", {"gates": str(gates)})

    async def running() -> bool:
        (task,) = (await stack.get_run(run_id)).tasks
        return task.state == types_pb2.TASK_STATE_RUNNING

    await poll_until(running, "the task to run", within=30)
    worker = stack.worker
    assert worker is not None
    worker.kill()  # kill -9: no drain, no hand-back; its lease must expire
    worker.spawn()
    await stack.workers_registered()

    async def rerun() -> bool:
        (task,) = (await stack.get_run(run_id)).tasks
        return task.attempts == 2 and task.state == types_pb2.TASK_STATE_RUNNING

    await poll_until(rerun, "the task's second attempt", within=60)

    async def dead_worker_offline() -> bool:
        answer = await stack.call(
            "ListWorkers", control_pb2.ListWorkersRequest(include_inactive=True)
        )
        return any(w.state == types_pb2.WORKER_STATE_OFFLINE for w in answer.workers)

    await poll_until(dead_worker_offline, "the killed worker's session to go offline", within=60)
    (gates / "hold").touch()
    await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)
    await sign_in(page, stack, "root", f"/runs/{run_id}")
    await expect(page.locator("#run-recovery")).to_contain_text("1 of 1 ran again")
    await page.click('svg.dag [data-key="hold"]')
    await expect(page.locator("#task-attempts")).to_contain_text("interrupted")
    await expect(page.locator("#task-attempts")).to_contain_text("succeeded")
    await shot(page, "run-after-worker-death")
    await page.click("nav >> text=Overview")
    await expect(page.locator("#recovery")).to_contain_text("1 task lost with a dead worker")
    interrupted = page.locator("#reliability tr", has_text="attempts interrupted: lease expired")
    await expect(interrupted.locator("td.num")).not_to_have_text("0")
    await shot(page, "overview-after-worker-death")
