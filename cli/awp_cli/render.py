"""How the CLI shows things: rich tables for people, protobuf JSON for scripts."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from awp.v1 import control_pb2, types_pb2
from awp_common.durations import format_duration
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.states import TERMINAL_RUN_STATES
from awp_sdk.decode import message_json, when
from awp_sdk.enums import AttemptState, DispatchState, RunState, TaskState, WorkerState, decode

# Piped output is not wrapped at 80 columns: a table row stays one line for grep and awk.
_PIPED_WIDTH: Final = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 250
stdout = Console(highlight=False, width=_PIPED_WIDTH)
# Long error lines must stay one line each, whatever the terminal width.
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# The order a task moves through its states (the protocol's enum order): tables list
# states this way. The CLI is a client: it learns states from the protocol, not the kernel.
TASK_STATE_ORDER: Final = tuple(
    name.removeprefix("TASK_STATE_").lower()
    for name, _ in types_pb2.TaskState.items()
    if name != "TASK_STATE_UNSPECIFIED"
)
_STYLES: Final = {
    "succeeded": "green",
    "failed": "bold red",
    "canceled": "yellow",
    "skipped": "dim",
    "pending": "dim",
    "ready": "white",
    "queued": "cyan",
    "running": "bold blue",
    "waiting_retry": "magenta",
    "interrupted": "magenta",
    "timed_out": "red",
    "active": "green",
    "draining": "yellow",
    "stopped": "dim",
    "offline": "red",
    "leased": "blue",
}


def print_json(message: Message, *, one_line: bool = False) -> None:
    """The protobuf JSON mapping as grpcurl prints it (camelCase names, `"version": 1`)."""
    text = json.dumps(message_json(message), indent=None if one_line else 2, ensure_ascii=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- small values


# The SDK's one enum mapping (awp_sdk.enums), which refuses a value it does not know.


def run_state(value: int) -> str:
    return decode(RunState, value)


def task_state(value: int) -> str:
    return decode(TaskState, value)


def attempt_state(value: int) -> str:
    return decode(AttemptState, value)


def dispatch_state(value: int) -> str:
    return decode(DispatchState, value)


def worker_state(value: int) -> str:
    return decode(WorkerState, value)


def task_counts(run: control_pb2.Run) -> dict[str, int]:
    """The run's tasks by state name, as counts_text shows them."""
    return {task_state(c.state): c.count for c in run.tasks_by_state}


def styled(state: str, text: str | None = None) -> Text:
    return Text(text if text is not None else state, style=_STYLES.get(state, ""))


def seconds_between(start: timestamp_pb2.Timestamp, end: timestamp_pb2.Timestamp) -> float | None:
    begin, finish = when(start), when(end)
    if begin is None:
        return None
    return ((finish or datetime.now(UTC)) - begin).total_seconds()


def ago(stamp: timestamp_pb2.Timestamp) -> str:
    moment = when(stamp)
    if moment is None:
        return "-"
    seconds = max(0.0, (datetime.now(UTC) - moment).total_seconds())
    return f"{format_duration(seconds)} ago" if seconds >= 1 else "just now"


def local_time(stamp: timestamp_pb2.Timestamp) -> str:
    moment = when(stamp)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def took(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def counts_text(by_state: dict[str, int], order: Sequence[str] = TASK_STATE_ORDER) -> Text:
    """'3 succeeded · 1 running' in state order, coloured, zeros left out."""
    text = Text()
    known = [s for s in order if by_state.get(s)]
    extra = sorted(s for s in by_state if s not in order and by_state[s])
    for state in (*known, *extra):
        if text:
            text.append(" · ", style="dim")
        text.append(f"{by_state[state]} {state}", style=_STYLES.get(state, ""))
    return text or Text("no tasks", style="dim")


def workflow_ref(name: str, version: int) -> str:
    return f"{name}@{version}"


# ---------------------------------------------------------------- workflows


def workflows_table(found: Iterable[control_pb2.Workflow]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "VERSION", "TASKS", "CONCURRENCY", "CREATED", "DESCRIPTION"):
        table.add_column(column)
    for workflow in found:
        d = workflow.definition
        table.add_row(
            d.name,
            str(d.version),
            str(len(d.tasks)),
            str(d.concurrency or "unlimited"),
            local_time(workflow.created_at),
            d.description,
        )
    return table


def _retry_text(task: types_pb2.TaskDefinition) -> str:
    if not task.HasField("retry"):
        return "default"
    r = task.retry
    backoff = format_duration(r.initial_backoff.ToTimedelta().total_seconds())
    cap = format_duration(r.max_backoff.ToTimedelta().total_seconds())
    return f"{r.max_attempts}x, {backoff}..{cap} x{r.backoff_multiplier:g}"


def _runs_text(task: types_pb2.TaskDefinition) -> str:
    """How a task runs, when not simply once: 'per element of plan.queries', 'always',
    'on failure: continue'."""
    parts = []
    if task.HasField("map"):
        parts.append(f"per element of {task.map.over}.{task.map.path}")
    if task.always:
        parts.append("always, at the end")
    if task.on_failure == types_pb2.FAILURE_POLICY_CONTINUE:
        parts.append("on failure: continue")
    return ", ".join(parts) or "once"


def workflow_view(workflow: control_pb2.Workflow) -> RenderableType:
    d = workflow.definition
    header = Text.assemble(
        (workflow_ref(d.name, d.version), "bold"),
        f"  {len(d.tasks)} tasks, concurrency {d.concurrency or 'unlimited'}, "
        f"created {local_time(workflow.created_at)}",
    )
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "KIND", "ACTION", "DEPENDS ON", "RETRY", "TIMEOUT", "RUNS"):
        table.add_column(column)
    for task in d.tasks:
        timeout = (
            format_duration(task.timeout.ToTimedelta().total_seconds())
            if task.HasField("timeout")
            else "default"
        )
        table.add_row(
            task.key,
            task.executor_kind,
            task.action,
            ", ".join(task.depends_on) or "-",
            _retry_text(task),
            timeout,
            _runs_text(task),
        )
    parts: list[RenderableType] = [header]
    if d.description:
        parts.append(Text(d.description, style="italic"))
    parts.append(table)
    return Group(*parts)


# ---------------------------------------------------------------- runs


def run_duration(run: control_pb2.Run) -> float | None:
    return seconds_between(run.created_at, run.finished_at)


def runs_table(found: Iterable[control_pb2.Run]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("RUN", "WORKFLOW", "STATE", "TASKS", "CREATED", "DURATION"):
        table.add_column(column)
    for run in found:
        state = run_state(run.state)
        if run.HasField("cancel_requested_at") and state == "running":
            state_text = styled("canceled", "canceling")
        else:
            state_text = styled(state)
        table.add_row(
            run.id,
            workflow_ref(run.workflow_name, run.workflow_version),
            state_text,
            counts_text(task_counts(run)),
            local_time(run.created_at),
            took(run_duration(run)),
        )
    return table


def run_header(run: control_pb2.Run) -> Text:
    state = run_state(run.state)
    text = Text.assemble(
        ("run ", "dim"),
        (run.id, "bold"),
        "  ",
        workflow_ref(run.workflow_name, run.workflow_version),
        "  ",
        styled(state),
        f"  {took(run_duration(run))}",
    )
    if run.HasField("cancel_requested_at") and state not in TERMINAL_RUN_STATES:
        text.append("  (cancel requested)", style="yellow")
    return text


def _attempts_text(task: control_pb2.Task) -> str:
    """Charged attempts of the allowed ones; hand-backs, which are free, said apart."""
    text = f"{task.attempts - task.hand_backs}/{task.max_attempts}"
    return f"{text} +{task.hand_backs} handed back" if task.hand_backs else text


def _task_span(task_key: str, attempts: Sequence[control_pb2.Attempt]) -> float | None:
    mine = [a for a in attempts if a.task_key == task_key and when(a.started_at)]
    if not mine:
        return None
    first = min(mine, key=lambda a: a.attempt)
    last = max(mine, key=lambda a: a.attempt)
    return seconds_between(first.started_at, last.finished_at)


def _output_text(task: control_pb2.Task) -> str:
    # A task that succeeded after a failed attempt still carries that attempt's error.
    if task.state != types_pb2.TASK_STATE_SUCCEEDED and task.error.message:
        return task.error.message
    if task.HasField("output"):
        return json.dumps(struct_to_dict(task.output), separators=(", ", ": "))
    if task.output_omitted:
        return f"(large: awp run output RUN {task.key})"
    return ""


def elements_of(tasks: Iterable[control_pb2.Task]) -> dict[str, list[control_pb2.Task]]:
    """The elements of each map task that has started, by its key, in index order."""
    found: dict[str, list[control_pb2.Task]] = {}
    for task in tasks:
        if task.map_parent:
            found.setdefault(task.map_parent, []).append(task)
    return found


def _elements_text(task: control_pb2.Task, elements: Sequence[control_pb2.Task]) -> Text:
    """'200 elements: 150 succeeded · 50 running', then the map task's own error."""
    counts = Counter(task_state(element.state) for element in elements)
    text = Text(f"{len(elements)} element{'' if len(elements) == 1 else 's'}")
    if elements:
        text.append(": ")
        text.append_text(counts_text(dict(counts)))
    if task.state != types_pb2.TASK_STATE_SUCCEEDED and task.error.message:
        text.append(f"  {task.error.message}", style=_STYLES.get("failed", ""))
    return text


def tasks_table(answer: control_pb2.GetRunResponse) -> Table:
    """One row per declared task; a map task's elements collapse into its row (their
    count by state), except those that failed, listed under it."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "STATE", "KIND", "ACTION", "ATTEMPTS", "TOOK"):
        table.add_column(column, no_wrap=True)
    # The only column that gives way when the terminal is narrow, and its cells stay one
    # line each (cut short, not wrapped).
    table.add_column("RESULT")
    elements = elements_of(answer.tasks)
    for task in answer.tasks:
        if task.map_parent:
            continue
        state = task_state(task.state)
        mine = elements.get(task.key)
        if mine is None:
            attempts = (
                Text(f"reused {task.reused_from_run_id[:8]}", style="dim")
                if task.reused_from_run_id
                else _attempts_text(task)
            )
            table.add_row(
                task.key,
                styled(state),
                task.executor_kind,
                task.action,
                attempts,
                took(_task_span(task.key, answer.attempts)),
                Text(_output_text(task), no_wrap=True, overflow="ellipsis"),
            )
            continue
        table.add_row(
            task.key,
            styled(state),
            task.executor_kind,
            task.action,
            f"{sum(e.attempts for e in mine)} in all",
            took(_span({e.key for e in mine}, answer.attempts)),
            Text.assemble(_elements_text(task, mine), no_wrap=True, overflow="ellipsis"),
        )
        for element in mine:
            if element.state == types_pb2.TASK_STATE_FAILED:
                table.add_row(
                    f"  {element.key}",
                    styled("failed"),
                    "",
                    "",
                    _attempts_text(element),
                    took(_task_span(element.key, answer.attempts)),
                    Text(_output_text(element), no_wrap=True, overflow="ellipsis"),
                )
    return table


def _span(keys: set[str], attempts: Sequence[control_pb2.Attempt]) -> float | None:
    """From the first attempt of these tasks to the end of the last."""
    mine = [a for a in attempts if a.task_key in keys and when(a.started_at)]
    if not mine:
        return None
    first = min(mine, key=lambda a: (a.started_at.seconds, a.started_at.nanos))
    ends = [a for a in mine if when(a.finished_at)]
    if len(ends) < len(mine):
        return seconds_between(first.started_at, timestamp_pb2.Timestamp())
    last = max(ends, key=lambda a: (a.finished_at.seconds, a.finished_at.nanos))
    return seconds_between(first.started_at, last.finished_at)


def attempts_table(
    attempts: Sequence[control_pb2.Attempt], tasks: Sequence[control_pb2.Task] = ()
) -> Table:
    """One row per attempt; the attempts of a map task's elements that succeeded collapse
    into one row per map task (the others are listed)."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "ATTEMPT", "STATE", "WORKER", "FENCE", "STARTED", "TOOK", "ERROR"):
        table.add_column(column)
    parent_of = {task.key: task.map_parent for task in tasks if task.map_parent}
    collapsed: dict[str, list[control_pb2.Attempt]] = {}
    for attempt in attempts:
        parent = parent_of.get(attempt.task_key)
        if parent is not None and attempt.state == types_pb2.ATTEMPT_STATE_SUCCEEDED:
            collapsed.setdefault(parent, []).append(attempt)
    for attempt in attempts:
        state = attempt_state(attempt.state)
        parent = parent_of.get(attempt.task_key)
        if parent is not None and state == "succeeded":
            # The map task's row stands where its first element succeeded.
            if collapsed[parent] and collapsed[parent][0] is attempt:
                _add_collapsed(table, parent, collapsed[parent])
            continue
        table.add_row(
            attempt.task_key,
            str(attempt.attempt),
            styled(state),
            attempt.worker_id[:8],
            str(attempt.fencing_token),
            local_time(attempt.started_at),
            took(seconds_between(attempt.started_at, attempt.finished_at)),
            attempt.error.message if attempt.HasField("error") else "",
        )
    return table


def _add_collapsed(table: Table, parent: str, succeeded: Sequence[control_pb2.Attempt]) -> None:
    table.add_row(
        f"{parent}[...]",
        "-",
        styled("succeeded", f"{len(succeeded)} succeeded"),
        f"{len({a.worker_id for a in succeeded})} workers",
        "",
        local_time(min((a.started_at for a in succeeded), key=lambda t: (t.seconds, t.nanos))),
        took(_span({a.task_key for a in succeeded}, succeeded)),
        "",
    )


def audit_text(run: control_pb2.Run) -> Text:
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


def error_text(error: types_pb2.TaskError) -> Text:
    """The error's message, and its exception type when the message does not say it."""
    text = Text(error.message, style="red")
    if error.type and not error.message.startswith(error.type.rsplit(".", 1)[-1]):
        text.append(f"  ({error.type})", style="dim")
    return text


def failures_view(answer: control_pb2.GetRunResponse) -> list[RenderableType]:
    """Each failed task's error and the traceback of its last attempt."""
    parts: list[RenderableType] = []
    for task in answer.tasks:
        if task.state != types_pb2.TASK_STATE_FAILED:
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
                f"every attempt and its log tail: awp logs {answer.run.id} {task.key}", style="dim"
            )
        )
    return parts


def run_view(answer: control_pb2.GetRunResponse) -> RenderableType:
    run = answer.run
    parts: list[RenderableType] = [
        run_header(run),
        audit_text(run),
        counts_text(task_counts(run)),
    ]
    parts += [Text(""), tasks_table(answer)]
    if answer.attempts:
        parts += [
            Text(""),
            Text("attempts", style="bold"),
            attempts_table(answer.attempts, answer.tasks),
        ]
    parts += failures_view(answer)
    parts += omissions_view(answer)
    return Group(*parts)


def omissions_view(answer: control_pb2.GetRunResponse) -> list[RenderableType]:
    """What a large run's answer left out to stay deliverable, and how to see it."""
    notes = []
    if answer.attempts_omitted:
        notes.append(f"{answer.attempts_omitted} later attempts not shown: awp logs RUN [TASK]")
    if answer.tracebacks_omitted:
        notes.append(f"{answer.tracebacks_omitted} tracebacks not shown: awp logs RUN TASK")
    if answer.tasks_omitted:
        notes.append(
            f"{answer.tasks_omitted} later tasks not shown (map elements counted above only "
            "as far as listed): awp run tasks RUN"
        )
    return [Text(note, style="yellow") for note in notes]


def task_list(tasks: Sequence[control_pb2.Task]) -> Table:
    """Every task listed as it is, map elements included (a page of ListTasks)."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "STATE", "ATTEMPTS"):
        table.add_column(column, no_wrap=True)
    table.add_column("RESULT")
    for task in tasks:
        table.add_row(
            task.key,
            styled(task_state(task.state)),
            _attempts_text(task),
            Text(_output_text(task), no_wrap=True, overflow="ellipsis"),
        )
    return table


def run_summary(answer: control_pb2.GetRunResponse) -> RenderableType:
    """What a finished run came to: its state, tasks by state, attempts, retries, failures."""
    run = answer.run
    state = run_state(run.state)
    # A map task's elements are summed up under it; its failure names the element.
    retried = [t for t in answer.tasks if t.attempts > 1 and not t.map_parent]
    elements = elements_of(answer.tasks)
    attempts = Counter(attempt_state(a.state) for a in answer.attempts)
    lines: list[RenderableType] = [
        Text.assemble(
            ("run ", "dim"),
            (run.id, "bold"),
            " ",
            styled(state),
            f" in {took(run_duration(run))}",
            ("  " + workflow_ref(run.workflow_name, run.workflow_version), "dim"),
        ),
        Text.assemble(("  tasks:    ", "dim"), counts_text(task_counts(run))),
        Text.assemble(
            ("  attempts: ", "dim"),
            f"{len(answer.attempts)} (",
            counts_text(dict(attempts), order=("succeeded", "failed", "interrupted")),
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
    reused = [t.key for t in answer.tasks if t.reused_from_run_id]
    if reused:
        text = ", ".join(reused)
        lines.append(Text.assemble(("  reused:   ", "dim"), f"{text} (not run again)"))
    failed = [
        task for task in answer.tasks if task_state(task.state) == "failed" and not task.map_parent
    ]
    for task in failed:
        lines.append(
            Text.assemble(
                ("  failed:   ", "dim"), (task.key, "bold red"), f": {task.error.message}"
            )
        )
    if failed:
        lines.append(
            Text(f"  tracebacks: awp run get {run.id}; resume: awp run retry {run.id}", style="dim")
        )
    return Group(*lines)


# ---------------------------------------------------------------- attempt logs


def attempt_log(attempt: control_pb2.Attempt) -> RenderableType:
    """One attempt as `awp logs` shows it: who ran it when, how it ended, what it left."""
    state = attempt_state(attempt.state)
    worker = (
        f"{attempt.worker_name} ({attempt.worker_id[:8]})"
        if attempt.worker_name
        else attempt.worker_id
    )
    parts: list[RenderableType] = [
        Text.assemble(
            ("== ", "dim"),
            (attempt.task_key, "bold"),
            f" attempt {attempt.attempt}  ",
            styled(state),
            ("  worker ", "dim"),
            worker,
            ("  started ", "dim"),
            local_time(attempt.started_at),
            ("  took ", "dim"),
            took(seconds_between(attempt.started_at, attempt.finished_at)),
        )
    ]
    if attempt.HasField("error"):
        error = attempt.error
        retry = "retryable" if error.retryable else "permanent"
        parts.append(Text.assemble(("error: ", "dim"), error_text(error), (f"  [{retry}]", "dim")))
        if error.traceback:
            parts.append(Text(error.traceback.rstrip("\n")))
        if error.log_tail:
            parts.append(Text("log tail:", style="dim"))
            parts.append(Text(error.log_tail.rstrip("\n"), style="dim"))
    return Group(*parts)


# ---------------------------------------------------------------- fleet


def workers_table(found: Iterable[control_pb2.WorkerInfo]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("WORKER", "NAME", "STATE", "KINDS", "LEASES", "HEARTBEAT", "REGISTERED"):
        table.add_column(column)
    for worker in found:
        state = worker_state(worker.state)
        table.add_row(
            worker.id,
            worker.name,
            styled(state),
            ",".join(worker.executor_kinds),
            f"{worker.active_leases}/{worker.max_concurrency}",
            ago(worker.last_heartbeat_at),
            local_time(worker.registered_at),
        )
    return table


def stats_view(stats: control_pb2.GetStatsResponse) -> RenderableType:
    table = Table(box=None, header_style="bold")
    for column in ("OF", "STATE", "KIND"):
        table.add_column(column)
    table.add_column("COUNT", justify="right")
    # The server lists each section in its enum's (lifecycle) order.
    sections: list[tuple[str, list[tuple[str, str, int]]]] = [
        ("runs", [(run_state(c.state), "", c.count) for c in stats.runs_by_state]),
        (
            "tasks of running runs",
            [(task_state(c.state), c.executor_kind, c.count) for c in stats.tasks_by_state],
        ),
        (
            "dispatches",
            [
                (dispatch_state(c.state), c.executor_kind, c.count)
                for c in stats.dispatches_by_state
            ],
        ),
        ("workers", [(worker_state(c.state), "", c.count) for c in stats.workers_by_state]),
    ]
    for section, rows in sections:
        if not rows:
            table.add_row(section, Text("none", style="dim"), "", "0")
        for state, kind, count in rows:
            table.add_row(section, styled(state), kind, str(count))
    oldest = (
        format_duration(stats.oldest_pending.ToTimedelta().total_seconds())
        if stats.HasField("oldest_pending")
        else "none pending"
    )
    footer = Text.assemble(
        ("active leases ", "dim"),
        (str(stats.active_leases), "bold"),
        ("   oldest pending dispatch ", "dim"),
        (oldest, "bold"),
    )
    return Group(table, Text(""), footer)


# ---------------------------------------------------------------- retention


def add_pruned(total: control_pb2.PruneRunsResponse, answer: control_pb2.PruneRunsResponse) -> None:
    """Adds one PruneRuns answer's counts to the total; what is left and the cutoff are
    the latest answer's."""
    for name in ("runs", "tasks", "attempts", "dispatches", "events"):
        setattr(total, name, getattr(total, name) + getattr(answer, name))
    total.remaining = answer.remaining
    total.cutoff.CopyFrom(answer.cutoff)


def prune_progress(total: control_pb2.PruneRunsResponse, dry_run: bool) -> str:
    verb = "counted" if dry_run else "deleted"
    return f"{verb} {total.runs:,} runs so far, {total.remaining:,} to go"


def prune_summary(total: control_pb2.PruneRunsResponse, dry_run: bool) -> Text:
    rows = (
        f"{total.tasks:,} tasks, {total.attempts:,} attempts, {total.dispatches:,} dispatches, "
        f"{total.events:,} events"
    )
    finished = f"finished before {local_time(total.cutoff)}"
    if dry_run:
        return Text(f"would delete {total.runs:,} runs {finished}, with {rows}")
    text = Text(f"deleted {total.runs:,} runs {finished}, with {rows}")
    if total.remaining:
        # Only runs other transactions held right then are skipped.
        text.append(
            f"\n{total.remaining:,} more were busy (another prune, most likely): run again",
            style="yellow",
        )
    return text
