"""Runs: the list, one run in full (`awp run get`) and what a finished run came to."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from awp_cli.render import counts_text, local_time, seconds_between, styled, took, workflow_ref
from awp_cli.render_tasks import attempts_table, elements_of, error_text, tasks_table
from awp_cli.render_waits import durable_view
from awp_common import tracing
from awp_sdk.enums import TaskState
from awp_sdk.records import Run, RunDecision, RunDetail


def task_counts(run: Run) -> dict[str, int]:
    """The run's tasks by state name, as counts_text shows them."""
    return {str(state): count for state, count in run.task_counts.items()}


def run_duration(run: Run) -> float | None:
    return seconds_between(run.created_at, run.finished_at)


def run_state_text(run: Run) -> Text:
    return styled("canceled", "canceling") if run.canceling else styled(run.state)


def runs_table(found: Iterable[Run]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("RUN", "WORKFLOW", "STATE", "TASKS", "CREATED", "DURATION"):
        table.add_column(column)
    for run in found:
        table.add_row(
            run.id,
            workflow_ref(run.workflow, run.version),
            run_state_text(run),
            counts_text(task_counts(run)),
            local_time(run.created_at),
            took(run_duration(run)),
        )
    return table


def run_header(run: Run) -> Text:
    text = Text.assemble(
        ("run ", "dim"),
        (run.id, "bold"),
        "  ",
        workflow_ref(run.workflow, run.version),
        "  ",
        styled(run.state),
        f"  {took(run_duration(run))}",
    )
    if run.canceling:
        text.append("  (cancel requested)", style="yellow")
    return text


def audit_text(run: Run) -> Text:
    """Who started the run and who asked for its cancellation (the audit trail), and the
    run it retried."""
    text = Text.assemble(("started by ", "dim"), run.started_by or "?")
    if run.cancel_requested_by:
        text.append_text(Text.assemble(("  cancel requested by ", "dim"), run.cancel_requested_by))
    if run.retried_from_run_id:
        text.append_text(Text.assemble(("  retried from run ", "dim"), run.retried_from_run_id))
        if run.retry_from_task:
            text.append_text(Text.assemble((" from task ", "dim"), run.retry_from_task))
    return text


def failures_view(detail: RunDetail) -> list[RenderableType]:
    """Each failed task's error and the traceback of its last attempt."""
    parts: list[RenderableType] = []
    for task in detail.tasks.values():
        if task.state is not TaskState.FAILED or task.error is None:
            continue
        parts += [
            Text(""),
            Text.assemble(
                ("task ", "dim"), (task.key, "bold red"), " failed: ", error_text(task.error)
            ),
        ]
        if task.error.traceback:
            parts.append(Text(task.error.traceback.rstrip("\n")))
        parts.append(
            Text(
                f"every attempt and its log tail: awp logs {detail.run.id} {task.key}", style="dim"
            )
        )
    return parts


def omissions_view(detail: RunDetail) -> list[RenderableType]:
    """What a large run's answer left out to stay deliverable, and how to see it."""
    notes = []
    if detail.attempts_omitted:
        notes.append(f"{detail.attempts_omitted} later attempts not shown: awp logs RUN [TASK]")
    if detail.tracebacks_omitted:
        notes.append(f"{detail.tracebacks_omitted} tracebacks not shown: awp logs RUN TASK")
    if detail.tasks_omitted:
        notes.append(
            f"{detail.tasks_omitted} later tasks not shown (map elements counted above only "
            "as far as listed): awp run tasks RUN"
        )
    return [Text(note, style="yellow") for note in notes]


def trace_text(run: Run, url_template: str | None) -> list[RenderableType]:
    """The run's trace id, and its page in the user's tracing UI (AWP_TRACE_URL)."""
    if run.trace_id is None:
        return []
    text = Text.assemble(("trace ", "dim"), run.trace_id)
    link = tracing.trace_link(url_template, run.trace_id)
    if link is not None:
        text.append_text(Text.assemble("  ", (link, f"link {link}")))
    return [text]


def run_view(
    detail: RunDetail, decisions: Sequence[RunDecision] = (), trace_url: str | None = None
) -> RenderableType:
    run = detail.run
    parts: list[RenderableType] = [
        run_header(run),
        audit_text(run),
        *trace_text(run, trace_url),
        counts_text(task_counts(run)),
        Text(""),
        tasks_table(detail),
    ]
    parts += durable_view(detail, decisions)
    if detail.attempts:
        parts += [
            Text(""),
            Text("attempts", style="bold"),
            attempts_table(detail.attempts, detail.tasks),
        ]
    parts += failures_view(detail)
    parts += omissions_view(detail)
    parts += waiting_view(detail)
    return Group(*parts)


def waiting_view(detail: RunDetail) -> list[RenderableType]:
    """The ready tasks a limit holds back, and why (GetRun's Task.waiting_for)."""
    held = [task for task in detail.tasks.values() if task.waiting_for]
    if not held:
        return []
    lines: list[RenderableType] = [Text(""), Text("held back", style="bold")]
    for task in held[:20]:
        lines.append(Text.assemble((f"  {task.key}: ", "bold"), task.waiting_for or ""))
    if len(held) > 20:
        lines.append(Text(f"  ... and {len(held) - 20} more", style="dim"))
    return lines


def run_summary(detail: RunDetail) -> RenderableType:
    """What a finished run came to: its state, tasks by state, attempts, retries, failures."""
    run = detail.run
    tasks = detail.tasks.values()
    # A map task's elements are summed up under it; its failure names the element.
    retried = [t for t in tasks if t.attempts > 1 and not t.map_parent]
    elements = elements_of(tasks)
    attempts = Counter(str(a.state) for a in detail.attempts)
    lines: list[RenderableType] = [
        Text.assemble(
            ("run ", "dim"),
            (run.id, "bold"),
            " ",
            styled(run.state),
            f" in {took(run_duration(run))}",
            ("  " + workflow_ref(run.workflow, run.version), "dim"),
        ),
        Text.assemble(("  tasks:    ", "dim"), counts_text(task_counts(run))),
        Text.assemble(
            ("  attempts: ", "dim"),
            f"{len(detail.attempts)} (",
            counts_text(attempts, order=("succeeded", "failed", "interrupted")),
            ")",
        ),
    ]
    retried_elements = {
        key: sum(1 for e in mine if e.attempts > 1) for key, mine in elements.items()
    }
    text = ", ".join(
        [f"{t.key} ({t.attempts} attempts)" for t in retried]
        + [f"{key}: {n} elements" for key, n in retried_elements.items() if n]
    )
    if text:
        lines.append(Text.assemble(("  retried:  ", "dim"), text))
    reused = [t.key for t in tasks if t.reused_from_run_id]
    if reused:
        lines.append(Text.assemble(("  reused:   ", "dim"), f"{', '.join(reused)} (not run again)"))
    failed = [t for t in tasks if t.state is TaskState.FAILED and not t.map_parent]
    for task in failed:
        message = task.error.message if task.error is not None else ""
        lines.append(Text.assemble(("  failed:   ", "dim"), (task.key, "bold red"), f": {message}"))
    if failed:
        lines.append(
            Text(f"  tracebacks: awp run get {run.id}; resume: awp run retry {run.id}", style="dim")
        )
    return Group(*lines)
