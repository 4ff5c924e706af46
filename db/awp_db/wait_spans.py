"""The spans of waits (docs/observability.md): a wait from its suspension to its
resumption, in its run's trace, recorded by the process that resumed it (a signal or a
decision: the server; a timer: the coordinator) once the resumption has committed, so a
resumption rolled back leaves no span."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import asyncpg

from awp_common import tracing
from awp_common.tracing import TraceRef


class WaitingTask(Protocol):
    @property
    def run_id(self) -> UUID: ...
    @property
    def key(self) -> str: ...
    @property
    def wait_kind(self) -> str: ...
    @property
    def wait_name(self) -> str: ...
    @property
    def wait_occurrence(self) -> int: ...
    @property
    def wait_attempt(self) -> int: ...
    @property
    def wait_since(self) -> datetime: ...


@dataclass(frozen=True, slots=True)
class Resumed:
    """A wait that ended, for its span: the task, when, and what ended it."""

    task: WaitingTask
    trace: TraceRef
    at: datetime
    by: str  # signal, approval, timer (a sleep's end) or timeout


def pending() -> list[Resumed]:
    """The spans a transaction that resumes waits collects, to `record` after it."""
    return []


def resumed(
    spans: list[Resumed], task: WaitingTask, row: asyncpg.Record | None, event: Mapping[str, Any]
) -> None:
    """Keeps the wait's span for `record`, if its run is traced (``row``: what the
    `resume` statement returned: when, and the run's trace; ``event``: the task event's
    payload, which says what ended the wait)."""
    if tracing.enabled() and row is not None and row["trace_id"] is not None:
        by = "timer" if "woke" in event else "timeout" if "timed_out" in event else task.wait_kind
        trace = TraceRef(row["trace_id"], row["trace_span"])
        spans.append(Resumed(task, trace, row["resumed_at"], by))


def record(spans: Sequence[Resumed]) -> None:
    """Each wait's span, suspended -> resumed (database clock); call after the commit."""
    for wait in spans:
        task = wait.task
        tracing.record(
            tracing.WAIT_SPAN,
            wait.trace,
            tracing.ns(task.wait_since),
            tracing.ns(wait.at),
            {
                tracing.RUN_ID: str(task.run_id),
                tracing.TASK_KEY: task.key,
                tracing.ATTEMPT: task.wait_attempt,
                tracing.WAIT_KIND: task.wait_kind,
                tracing.WAIT_NAME: task.wait_name,
                tracing.WAIT_OCCURRENCE: task.wait_occurrence,
                tracing.WAIT_RESUMED_BY: wait.by,
            },
        )
