"""Stored workflow versions, as `awp workflow list` and `awp workflow get` show them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from awp_cli.render import local_time, workflow_ref
from awp_common.durations import format_duration
from awp_sdk.enums import FailurePolicy
from awp_sdk.records import StoredTask, StoredWorkflow


def workflows_table(found: Iterable[StoredWorkflow]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "VERSION", "TASKS", "CONCURRENCY", "CREATED", "DESCRIPTION"):
        table.add_column(column)
    for workflow in found:
        table.add_row(
            workflow.name,
            str(workflow.version),
            str(len(workflow.tasks)),
            str(workflow.concurrency or "unlimited"),
            local_time(workflow.created_at),
            workflow.description,
        )
    return table


def _seconds(value: timedelta | None) -> str:
    # An unset duration reads as the zero it is on the wire.
    return format_duration(value.total_seconds() if value is not None else 0.0)


def _retry_text(task: StoredTask) -> str:
    r = task.retry
    if r is None:
        return "default"
    return (
        f"{r.max_attempts or 0}x, {_seconds(r.initial_backoff)}..{_seconds(r.max_backoff)} "
        f"x{r.multiplier or 0:g}"
    )


def _runs_text(task: StoredTask) -> str:
    """How a task runs, when not simply once: 'per element of plan.queries', 'always',
    'on failure: continue'."""
    parts = []
    if task.map is not None:
        parts.append(f"per element of {task.map.over}.{task.map.path}")
    if task.always:
        parts.append("always, at the end")
    if task.on_failure is FailurePolicy.CONTINUE:
        parts.append("on failure: continue")
    return ", ".join(parts) or "once"


def workflow_view(workflow: StoredWorkflow) -> RenderableType:
    header = Text.assemble(
        (workflow_ref(workflow.name, workflow.version), "bold"),
        f"  {len(workflow.tasks)} tasks, concurrency {workflow.concurrency or 'unlimited'}, "
        f"created {local_time(workflow.created_at)}",
    )
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "KIND", "ACTION", "DEPENDS ON", "RETRY", "TIMEOUT", "RUNS"):
        table.add_column(column)
    for task in workflow.tasks:
        table.add_row(
            task.key,
            task.executor_kind,
            task.action,
            ", ".join(task.depends_on) or "-",
            _retry_text(task),
            "default" if task.timeout is None else _seconds(task.timeout),
            _runs_text(task),
        )
    parts: list[RenderableType] = [header]
    if workflow.description:
        parts.append(Text(workflow.description, style="italic"))
    parts.append(table)
    return Group(*parts)
