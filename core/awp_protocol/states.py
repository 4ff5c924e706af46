"""The states of runs, tasks, attempts, dispatches and workers, as storage names them
('waiting_retry'; the API's enums say TASK_STATE_WAITING_RETRY), and which are final."""

from __future__ import annotations

from typing import Final, Literal, get_args

from awp.v1 import types_pb2

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
    "waiting",
]
AttemptState = Literal[
    "running", "succeeded", "failed", "interrupted", "timed_out", "canceled", "suspended"
]
DispatchState = Literal["pending", "leased", "completed", "expired", "canceled"]
WorkerState = Literal["active", "draining", "stopped", "offline"]

# In lifecycle order, as the Literals list them (and the API's enums number them).
RUN_STATES: Final[tuple[RunState, ...]] = get_args(RunState)
TASK_STATES: Final[tuple[TaskState, ...]] = get_args(TaskState)
ATTEMPT_STATES: Final[tuple[AttemptState, ...]] = get_args(AttemptState)
DISPATCH_STATES: Final[tuple[DispatchState, ...]] = get_args(DispatchState)
WORKER_STATES: Final[tuple[WorkerState, ...]] = get_args(WorkerState)

# What a checkpoint (a memo of a task) records (docs/design.md §16; awp.v1.CheckpointKind).
CheckpointKind = Literal["step", "sleep", "signal", "approval"]
CHECKPOINT_KINDS: Final[tuple[CheckpointKind, ...]] = get_args(CheckpointKind)

TERMINAL_TASK_STATES: Final[frozenset[str]] = frozenset(
    {"succeeded", "failed", "canceled", "skipped"}
)
# Tasks not yet ended: a run with one is still running. WAITING is live (§16).
LIVE_TASK_STATES: Final[frozenset[str]] = frozenset(
    {"pending", "ready", "queued", "running", "waiting_retry", "waiting"}
)
TERMINAL_RUN_STATES: Final[frozenset[str]] = frozenset({"succeeded", "failed", "canceled"})


def task_state_name(value: int) -> str:
    """The storage name of an awp.v1.TaskState value (TASK_STATE_WAITING_RETRY ->
    'waiting_retry'); 'unknown(<n>)' for a value newer than this version."""
    try:
        name = types_pb2.TaskState.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return f"unknown({value})"
    return name.removeprefix("TASK_STATE_").lower()


# The error message of an attempt a draining worker handed back (it ends `interrupted`,
# as one whose lease was lost does): how a reader tells the two apart.
HANDED_BACK: Final = "handed back by a draining worker"


def charged_attempts(attempt: int, hand_backs: int, suspensions: int) -> int:
    """The attempts, up to `attempt`, that spent the task's budget: free hand-backs and
    attempts suspended at a wait (docs/design.md §16) cost nothing. Here, below every
    layer, so that storage, the SDK's records and the console count them alike."""
    return attempt - hand_backs - suspensions
