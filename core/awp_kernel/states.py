"""States of runs, tasks, attempts, dispatches and workers, and their allowed moves."""

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

RUN_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "running": frozenset({"succeeded", "failed", "canceled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
}

TASK_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "pending": frozenset({"ready", "canceled", "skipped"}),
    "ready": frozenset({"queued", "canceled", "skipped"}),
    # queued -> ready: the dispatch was withdrawn (no compatible worker), nothing spent.
    "queued": frozenset({"running", "ready", "canceled", "skipped"}),
    "running": frozenset({"succeeded", "failed", "waiting_retry", "canceled"}),
    "waiting_retry": frozenset({"ready", "canceled", "skipped"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
    "skipped": frozenset(),
}

ATTEMPT_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "running": frozenset({"succeeded", "failed", "interrupted", "timed_out", "canceled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "interrupted": frozenset(),
    "timed_out": frozenset(),
    "canceled": frozenset(),
}

DISPATCH_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "pending": frozenset({"leased", "expired", "canceled"}),
    "leased": frozenset({"completed", "expired", "canceled"}),
    "completed": frozenset(),
    "expired": frozenset(),
    "canceled": frozenset(),
}

WORKER_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "active": frozenset({"draining", "stopped", "offline"}),
    "draining": frozenset({"stopped", "offline"}),
    "stopped": frozenset(),
    "offline": frozenset(),
}


class IllegalTransition(ValueError):
    """A state change the lifecycle does not allow: a bug, never user input."""


def check_transition(table: dict[str, frozenset[str]], current: str, target: str) -> None:
    if target not in table.get(current, frozenset()):
        raise IllegalTransition(f"{current} -> {target} is not allowed")


def run_outcome(task_states: list[str]) -> RunState:
    """The run state implied by its tasks' states ('running' until all are terminal)."""
    if any(state not in TERMINAL_TASK_STATES for state in task_states):
        return "running"
    if any(state == "failed" for state in task_states):
        return "failed"
    if any(state == "canceled" for state in task_states):
        return "canceled"
    return "succeeded"
