"""Approvals in the console, in a real browser against real processes (as
test_console_browser): a waiting task shows on the graph, in the runs list and in its
panel with its prompt; an approver decides it there with a comment, and the decision is
recorded (the panel's audit line, the run's events, the server's audit log); a viewer is
offered nothing, and a forged decision is refused by the console and by the server."""

from __future__ import annotations

import json
import re
from typing import Final

import grpc
import pytest
from playwright.async_api import Page, expect

from awp.v1 import durable_pb2, runs_pb2, types_pb2
from awp_protocol.errors import Reason, decode_details
from console.conftest import Shot
from console.stack import ConsoleStack
from console.test_console_browser import scripts_ready, sign_in
from kit import poll_until

REVIEWED: Final = "console-reviewed"
PROMPT: Final = "Publish THE RELEASE NOTES?"


@pytest.fixture(scope="module")
async def reviewed(stack: ConsoleStack) -> None:
    await stack.apply(
        REVIEWED,
        [
            ("draft", "console.fetch", []),
            ("review", "console.review", ["draft"]),
            ("publish", "console.fetch", ["review"]),
        ],
    )


async def waiting_run(stack: ConsoleStack) -> str:
    run_id = await stack.start_run(REVIEWED, {})

    async def waiting() -> bool:
        tasks = {t.key: t for t in (await stack.get_run(run_id)).tasks}
        return tasks["review"].state == types_pb2.TASK_STATE_WAITING

    await poll_until(waiting, f"run {run_id}'s review to wait", within=60)
    return run_id


async def test_an_approver_approves_in_the_page_and_the_decision_is_recorded(
    page: Page, stack: ConsoleStack, shot: Shot, reviewed: None
) -> None:
    run_id = await waiting_run(stack)
    await sign_in(page, stack, "ada", "/runs")
    row = page.locator(f'#runs tr[data-run="{run_id}"]')
    await expect(row.locator(".run-waiting")).to_have_text("1 waiting")
    await shot(page, "runs-list-waiting")
    await row.locator("a").first.click()
    review = page.locator('svg.dag [data-key="review"]')
    await expect(review).to_have_class(re.compile(r"\bs-waiting\b"))
    await scripts_ready(page)
    await review.click()
    await expect(page.locator("#wait-prompt")).to_have_text(PROMPT)
    await expect(page.locator("#wait-due")).to_have_text("never")
    await page.fill("#decide-comment", "checked the figures, go")
    await shot(page, "approval-panel")
    await page.click("#approve")
    # Back on the run with the task's panel open: the decision and who made it.
    await expect(page).to_have_url(re.compile(rf"/runs/{run_id}#task=review$"))
    await expect(review).to_have_class(re.compile(r"\bs-succeeded\b"))
    audit = page.locator("#task-decisions")
    await expect(audit).to_contain_text("approved by ada")
    await expect(audit).to_contain_text("checked the figures, go")
    await expect(page.locator("#run-state")).to_have_text("succeeded")
    await shot(page, "approved")
    await expect(audit).to_contain_text("resuming attempt 1")
    # Attempt 2 ran after a free suspension: the task list charges one of the one allowed,
    # as the panel does (it read "2 / 1 attempts" once), live and after a reload.
    listed = page.locator("#task-list .vrow", has_text="review")
    await expect(listed).to_contain_text("1 / 1 attempts")
    await expect(page.locator("#task-panel")).to_contain_text("1 of at most 1")
    await page.reload()
    await expect(listed).to_contain_text("1 / 1 attempts")
    # The action got the decision; the server's audit log has it too.
    output = await stack.call(
        "GetTaskOutput", runs_pb2.GetTaskOutputRequest(run_id=run_id, task_key="review")
    )
    assert json.loads(output.output_json)["approved_by"] == "ada"
    server = next(p for p in stack.processes if p.name == "server")
    assert re.search(rf"Approve.*{run_id}|{run_id}.*Approve", server.output()), server.tail()


async def test_a_viewer_is_offered_no_decision_and_a_forged_one_is_refused_twice(
    page: Page, stack: ConsoleStack, shot: Shot, reviewed: None
) -> None:
    run_id = await waiting_run(stack)
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    review = page.locator('svg.dag [data-key="review"]')
    await expect(review).to_have_class(re.compile(r"\bs-waiting\b"))
    await review.click()
    await expect(page.locator("#wait-prompt")).to_have_text(PROMPT)
    await expect(page.locator("#decide-form")).to_have_count(0)
    await expect(page.locator("#wait-deciders")).to_contain_text("victor (viewer) may not")
    await shot(page, "viewer-sees-the-prompt-only")
    csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
    forged = await page.request.post(
        f"{stack.url}/runs/{run_id}/decide",
        form={"csrf": csrf or "", "task_key": "review", "decision": "approve"},
        headers={"origin": stack.url},
    )
    assert forged.status == 403
    assert "may not call Approve" in await forged.text()
    request = durable_pb2.ApproveRequest(run_id=run_id, task_key="review")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.call("Approve", request, "victor")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert decode_details(refused.value.trailing_metadata()).reason == Reason.PERMISSION_DENIED
    tasks = {t.key: t for t in (await stack.get_run(run_id)).tasks}
    assert tasks["review"].state == types_pb2.TASK_STATE_WAITING
    await stack.call("CancelRun", runs_pb2.CancelRunRequest(run_id=run_id))
