"""The states of runs, tasks, attempts, dispatches and workers, as storage names them
('waiting_retry'; the API's enums say TASK_STATE_WAITING_RETRY), and which are final."""

from __future__ import annotations

from typing import Final, Literal

RunState = Literal["running", "succeeded", "failed", "canceled"]
TaskState = Literal[
    "pending",
    "ready",
    "queued",
    "running",
    "waiting_retry",
    "succeeded",
    "failed",
    "canceled",
    "skipped",
]
AttemptState = Literal["running", "succeeded", "failed", "interrupted", "timed_out", "canceled"]
DispatchState = Literal["pending", "leased", "completed", "expired", "canceled"]
WorkerState = Literal["active", "draining", "stopped", "offline"]

RUN_STATES: Final[tuple[RunState, ...]] = ("running", "succeeded", "failed", "canceled")
TASK_STATES: Final[tuple[TaskState, ...]] = (
    "pending",
    "ready",
    "queued",
    "running",
    "waiting_retry",
    "succeeded",
    "failed",
    "canceled",
    "skipped",
)
ATTEMPT_STATES: Final[tuple[AttemptState, ...]] = (
    "running",
    "succeeded",
    "failed",
    "interrupted",
    "timed_out",
    "canceled",
)
DISPATCH_STATES: Final[tuple[DispatchState, ...]] = (
    "pending",
    "leased",
    "completed",
    "expired",
    "canceled",
)
WORKER_STATES: Final[tuple[WorkerState, ...]] = ("active", "draining", "stopped", "offline")

TERMINAL_TASK_STATES: Final[frozenset[str]] = frozenset(
    {"succeeded", "failed", "canceled", "skipped"}
)
TERMINAL_RUN_STATES: Final[frozenset[str]] = frozenset({"succeeded", "failed", "canceled"})
