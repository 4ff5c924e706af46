"""The console's pure parts for durable execution: who is offered a decision, and what a
waiting task's panel shows."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from awp_console import pages, web
from awp_protocol.roles import Role
from awp_sdk.enums import CheckpointKind, RunState, TaskState
from awp_sdk.records import Identity, MemoSavings, Run, RunDecision, TaskStatus, TaskWait


def _task(key: str, state: str) -> TaskStatus:
    return TaskStatus(key, TaskState(state), "python", "m:f", (), 1, 3, None, None, None, None)


def _approval(role: str = "") -> TaskWait:
    since = datetime(2025, 1, 1, tzinfo=UTC)
    return TaskWait(CheckpointKind.APPROVAL, "approval", "Publish?", role, since, None, 2)


def test_only_a_role_that_may_decide_is_offered_the_decision() -> None:
    approver = Identity("ada", frozenset({Role.APPROVER}), True)
    admin = Identity("root", frozenset({Role.ADMIN}), True)
    submitter = Identity("alice", frozenset({Role.SUBMITTER}), True)
    viewer = Identity("victor", frozenset({Role.VIEWER}), True)
    anyone = Identity("anonymous", frozenset(Role), False)  # a server without credentials
    assert [pages.may_decide(i, _approval()) for i in (approver, admin, submitter, viewer)] == [
        True,
        True,
        False,
        False,
    ]
    # A wait that asks for admins: an approver may not.
    assert not pages.may_decide(approver, _approval("admin"))
    assert pages.may_decide(admin, _approval("admin")) and pages.may_decide(anyone, _approval())
    # Nothing to decide: no wait, or a wait for a signal or for time.
    sleep = dataclasses.replace(_approval(), kind=CheckpointKind.SLEEP, name="", prompt="")
    assert not pages.may_decide(admin, None) and not pages.may_decide(admin, sleep)


def test_the_task_panel_shows_the_wait_its_prompt_and_the_decision_form() -> None:
    task = dataclasses.replace(
        _task("review", "waiting"),
        attempts=3,
        suspensions=2,
        wait=_approval("admin"),
        saved=MemoSavings(steps=2, tokens=1234, cost_usd=0.02),
    )
    run = Run(
        "r", "w", 1, RunState.RUNNING, {}, "", 1, 1, None, None, None, started_by="admin"
    )  # fmt: skip
    template = web.templates().env.get_template("task.html")

    def render(identity: Identity, decide: bool) -> str:
        return template.render(
            run=run,
            task=task,
            definition=None,
            attempts=[],
            error=None,
            timeline=[],
            may_cancel=False,
            may_retry=False,
            may_decide=decide,
            retry_request_id="x",
            decisions=[],
            csrf="form-token",
            now=datetime(2025, 1, 1, 0, 5, tzinfo=UTC),
            who=web.Caller(None, None, identity),  # type: ignore[arg-type]
        )

    shown = render(Identity("root", frozenset({Role.ADMIN}), True), True)
    assert "1 of at most 3" in shown  # suspensions are free
    assert "2 suspended at waits, not counted" in shown
    assert "2 steps not run again, 1,234 tokens, $0.0200" in shown
    assert '<blockquote id="wait-prompt">Publish?</blockquote>' in shown
    assert 'id="wait-due">never<' in shown
    assert '<input type="hidden" name="csrf" value="form-token">' in shown
    assert 'value="approve" id="approve"' in shown and 'value="reject"' in shown
    refused = render(Identity("ada", frozenset({Role.APPROVER}), True), False)
    assert "Publish?" in refused and 'id="decide-form"' not in refused
    assert "Admins decide; ada (approver) may not." in refused


def test_the_task_panel_lists_the_decisions_made_with_who_and_the_comment() -> None:
    task = dataclasses.replace(_task("review", "running"), attempts=2, suspensions=1)
    run = Run(
        "r", "w", 1, RunState.RUNNING, {}, "", 1, 9, None, None, None, started_by="admin"
    )  # fmt: skip
    at = datetime(2025, 1, 1, 0, 3, tzinfo=UTC)
    decided = RunDecision("review", False, "ada", "<b>not yet</b>", 1, at)
    shown = (
        web.templates()
        .env.get_template("task.html")
        .render(
            run=run,
            task=task,
            definition=None,
            attempts=[],
            error=None,
            timeline=[],
            may_cancel=False,
            may_retry=False,
            may_decide=False,
            decisions=[decided],
            retry_request_id="x",
        )
    )
    assert (
        "<li><b>rejected</b> by <b>ada</b> at 2025-01-01 00:03:00 UTC, resuming attempt 1: "
        "<q>&lt;b&gt;not yet&lt;/b&gt;</q></li>"
    ) in shown


def test_the_run_header_says_what_memos_saved_the_run() -> None:
    run = Run(
        "r", "w", 1, RunState.RUNNING, {}, "", 1, 9, None, None, None, started_by="admin"
    )  # fmt: skip
    template = web.templates().env.get_template("run_header.html")
    context = {"run": run, "may_cancel": False, "may_retry": False, "retry_request_id": "x"}
    now = datetime(2025, 1, 1, tzinfo=UTC)
    shown = template.render(saved=MemoSavings(3, 12_345, 0.5), now=now, **context)
    assert '<dd id="run-savings">3 steps not run again, 12,345 tokens, $0.5000</dd>' in shown
    assert "run-savings" not in template.render(saved=MemoSavings(), now=now, **context)
