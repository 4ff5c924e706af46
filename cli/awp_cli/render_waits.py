"""Durable execution in `awp run get` (docs/design.md §16): the tasks that wait and what
for, and what replayed step memos saved the run's tasks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from awp_cli.render import ago, local_time
from awp_sdk.enums import CheckpointKind
from awp_sdk.records import MemoSavings, RunDecision, RunDetail, TaskStatus, TaskWait


def wait_text(wait: TaskWait) -> str:
    """What a task waits for, in a few words."""
    if wait.kind is CheckpointKind.SLEEP:
        return "sleep"
    if wait.kind is CheckpointKind.SIGNAL:
        return f"signal {wait.name!r}"
    deciders = "admins" if wait.role == "admin" else "approvers or admins"
    return f"approval {wait.name!r} by {deciders}"


def _due_text(wait: TaskWait) -> str:
    if wait.due_at is None:
        return "never" if wait.kind is not CheckpointKind.SLEEP else "-"
    return local_time(wait.due_at)


def waits_table(tasks: Iterable[TaskStatus]) -> Table | None:
    """One row per waiting task: what for, since when, until when, and the prompt; None
    when no task waits."""
    waiting = [task for task in tasks if task.wait is not None]
    if not waiting:
        return None
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "WAITS FOR", "SINCE", "WAKES / TIMES OUT", "ATTEMPT"):
        table.add_column(column, no_wrap=True)
    table.add_column("PROMPT")
    for task in waiting:
        wait = task.wait
        assert wait is not None
        table.add_row(
            task.key,
            wait_text(wait),
            ago(wait.since),
            _due_text(wait),
            str(wait.attempt) if wait.attempt else "no worker",
            wait.prompt,
        )
    return table


def savings_text(saved: MemoSavings) -> str:
    """'2 steps, 1,234 tokens, $0.0200 not spent again'."""
    parts = [f"{saved.steps} step{'s' * (saved.steps != 1)}"]
    if saved.tokens:
        parts.append(f"{saved.tokens:,} tokens")
    if saved.cost_usd:
        parts.append(f"${saved.cost_usd:,.4f}")
    return ", ".join(parts) + " not run again"


def decision_line(decision: RunDecision) -> Text:
    """'review  approved by ada at 2025-01-01 10:00:00, resuming attempt 2: "looks good"'."""
    verdict = ("approved", "green") if decision.approved else ("rejected", "bold red")
    text = Text.assemble(
        (f"  {decision.task_key}  ", "bold"),
        verdict,
        f" by {decision.decided_by or '?'} at {local_time(decision.decided_at)}",
    )
    if decision.resumed_attempt:
        text.append(f", resuming attempt {decision.resumed_attempt}")
    if decision.comment:
        text.append(f": {decision.comment!r}")
    return text


def durable_view(detail: RunDetail, decisions: Sequence[RunDecision] = ()) -> list[RenderableType]:
    """The run's waiting tasks, the decisions made on its approvals (the audit trail),
    and the savings of its tasks' memos (with the run's sum)."""
    parts: list[RenderableType] = []
    table = waits_table(detail.tasks.values())
    if table is not None:
        parts += [
            Text(""),
            Text("waiting", style="bold"),
            table,
            Text(
                f"resume: awp approve|reject {detail.run.id} TASK, "
                f"awp signal send {detail.run.id} NAME",
                style="dim",
            ),
        ]
    if decisions:
        parts += [Text(""), Text("decisions", style="bold")]
        parts += [decision_line(decision) for decision in decisions]
    saved = [task for task in detail.tasks.values() if task.saved]
    if saved:
        parts += [Text(""), Text(f"memos saved: {savings_text(detail.saved)}", style="bold")]
        parts += [
            Text.assemble(("  ", ""), (task.key, "bold"), f": {savings_text(task.saved)}")
            for task in saved
        ]
    return parts
