"""A run's tasks and attempts: the tables of `awp run get` and `awp run tasks`, and
each attempt as `awp logs` shows it."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from awp_cli.render import STYLES, counts_text, local_time, seconds_between, styled, took
from awp_cli.render_waits import wait_text
from awp_sdk.enums import AttemptState, TaskState
from awp_sdk.records import Attempt, RunDetail, TaskError, TaskStatus


def attempts_text(task: TaskStatus) -> str:
    """Charged attempts of the allowed ones; hand-backs and suspensions at a wait, which
    are free, said apart."""
    text = f"{task.charged_attempts}/{task.max_attempts}"
    if task.hand_backs:
        text += f" +{task.hand_backs} handed back"
    if task.suspensions:
        text += f" +{task.suspensions} suspended"
    return text


def _span(keys: set[str], attempts: Sequence[Attempt]) -> float | None:
    """From the first attempt of these tasks to the end of the last (now, while one runs)."""
    mine = [a for a in attempts if a.task_key in keys and a.started_at is not None]
    if not mine:
        return None
    first = min(a.started_at for a in mine if a.started_at is not None)
    ends = [a.finished_at for a in mine if a.finished_at is not None]
    return seconds_between(first, max(ends) if len(ends) == len(mine) else None)


def _task_span(task_key: str, attempts: Sequence[Attempt]) -> float | None:
    mine = [a for a in attempts if a.task_key == task_key and a.started_at is not None]
    if not mine:
        return None
    first = min(mine, key=lambda a: a.attempt)
    last = max(mine, key=lambda a: a.attempt)
    return seconds_between(first.started_at, last.finished_at)


def output_text(task: TaskStatus) -> str:
    if task.wait is not None:
        return f"waits for {wait_text(task.wait)}"
    # A task that succeeded after a failed attempt still carries that attempt's error.
    if task.state is not TaskState.SUCCEEDED and task.error is not None and task.error.message:
        return task.error.message
    if task.output is not None:
        return json.dumps(task.output, separators=(", ", ": "))
    if task.output_omitted:
        return f"(large: awp run output RUN {task.key})"
    return ""


def elements_of(tasks: Iterable[TaskStatus]) -> dict[str, list[TaskStatus]]:
    """The elements of each map task that has started, by its key, in index order."""
    found: dict[str, list[TaskStatus]] = {}
    for task in tasks:
        if task.map_parent:
            found.setdefault(task.map_parent, []).append(task)
    return found


def _elements_text(task: TaskStatus, elements: Sequence[TaskStatus]) -> Text:
    """'200 elements: 150 succeeded · 50 running', then the map task's own error."""
    counts = Counter(str(element.state) for element in elements)
    text = Text(f"{len(elements)} element{'' if len(elements) == 1 else 's'}")
    if elements:
        text.append(": ")
        text.append_text(counts_text(counts))
    if task.state is not TaskState.SUCCEEDED and task.error is not None and task.error.message:
        text.append(f"  {task.error.message}", style=STYLES.get("failed", ""))
    return text


def _cell(text: str | Text) -> Text:
    # Cells of the one column that gives way stay one line each (cut short, not wrapped).
    return Text.assemble(text, no_wrap=True, overflow="ellipsis")


def tasks_table(detail: RunDetail) -> Table:
    """One row per declared task; a map task's elements collapse into its row (their
    count by state), except those that failed, listed under it."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "STATE", "KIND", "ACTION", "ATTEMPTS", "TOOK"):
        table.add_column(column, no_wrap=True)
    # The only column that gives way when the terminal is narrow.
    table.add_column("RESULT")
    tasks = detail.tasks.values()
    elements = elements_of(tasks)
    for task in tasks:
        if task.map_parent:
            continue
        mine = elements.get(task.key)
        if mine is None:
            attempts: str | Text = (
                Text(f"reused {task.reused_from_run_id[:8]}", style="dim")
                if task.reused_from_run_id
                else attempts_text(task)
            )
            table.add_row(
                task.key,
                styled(task.state),
                task.executor_kind,
                task.action,
                attempts,
                took(_task_span(task.key, detail.attempts)),
                _cell(output_text(task)),
            )
            continue
        table.add_row(
            task.key,
            styled(task.state),
            task.executor_kind,
            task.action,
            f"{sum(e.attempts for e in mine)} in all",
            took(_span({e.key for e in mine}, detail.attempts)),
            _cell(_elements_text(task, mine)),
        )
        for element in mine:
            if element.state is TaskState.FAILED:
                table.add_row(
                    f"  {element.key}",
                    styled("failed"),
                    "",
                    "",
                    attempts_text(element),
                    took(_task_span(element.key, detail.attempts)),
                    _cell(output_text(element)),
                )
    return table


def attempts_table(attempts: Sequence[Attempt], tasks: Mapping[str, TaskStatus]) -> Table:
    """One row per attempt; the attempts of a map task's elements that succeeded collapse
    into one row per map task (the others are listed)."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "ATTEMPT", "STATE", "WORKER", "FENCE", "STARTED", "TOOK", "ERROR"):
        table.add_column(column)
    parent_of = {key: task.map_parent for key, task in tasks.items() if task.map_parent}
    collapsed: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        parent = parent_of.get(attempt.task_key)
        if parent is not None and attempt.state is AttemptState.SUCCEEDED:
            collapsed.setdefault(parent, []).append(attempt)
    for attempt in attempts:
        parent = parent_of.get(attempt.task_key)
        if parent is not None and attempt.state is AttemptState.SUCCEEDED:
            # The map task's row stands where its first element succeeded.
            if collapsed[parent][0] is attempt:
                _add_collapsed(table, parent, collapsed[parent])
            continue
        table.add_row(
            attempt.task_key,
            str(attempt.attempt),
            styled(attempt.state),
            attempt.worker_id[:8],
            str(attempt.fencing_token),
            local_time(attempt.started_at),
            took(seconds_between(attempt.started_at, attempt.finished_at)),
            attempt.error.message if attempt.error is not None else "",
        )
    return table


def _add_collapsed(table: Table, parent: str, succeeded: Sequence[Attempt]) -> None:
    starts = [a.started_at for a in succeeded if a.started_at is not None]
    table.add_row(
        f"{parent}[...]",
        "-",
        styled("succeeded", f"{len(succeeded)} succeeded"),
        f"{len({a.worker_id for a in succeeded})} workers",
        "",
        local_time(min(starts) if starts else None),
        took(_span({a.task_key for a in succeeded}, succeeded)),
        "",
    )


def task_list(tasks: Sequence[TaskStatus]) -> Table:
    """Every task listed as it is, map elements included (a page of ListTasks)."""
    table = Table(box=None, header_style="bold")
    for column in ("TASK", "STATE", "ATTEMPTS"):
        table.add_column(column, no_wrap=True)
    table.add_column("RESULT")
    for task in tasks:
        table.add_row(task.key, styled(task.state), attempts_text(task), _cell(output_text(task)))
    return table


def error_text(error: TaskError) -> Text:
    """The error's message, and its exception type when the message does not say it."""
    text = Text(error.message, style="red")
    if error.type and not error.message.startswith(error.type.rsplit(".", 1)[-1]):
        text.append(f"  ({error.type})", style="dim")
    return text


def attempt_log(attempt: Attempt) -> RenderableType:
    """One attempt as `awp logs` shows it: who ran it when, how it ended, what it left."""
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
            styled(attempt.state),
            ("  worker ", "dim"),
            worker,
            ("  started ", "dim"),
            local_time(attempt.started_at),
            ("  took ", "dim"),
            took(seconds_between(attempt.started_at, attempt.finished_at)),
        )
    ]
    error = attempt.error
    if error is not None:
        retry = "retryable" if error.retryable else "permanent"
        parts.append(Text.assemble(("error: ", "dim"), error_text(error), (f"  [{retry}]", "dim")))
        if error.traceback:
            parts.append(Text(error.traceback.rstrip("\n")))
        if error.log_tail:
            parts.append(Text("log tail:", style="dim"))
            parts.append(Text(error.log_tail.rstrip("\n"), style="dim"))
    return Group(*parts)
