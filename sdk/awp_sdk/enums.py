"""The API's enums as Python values: the one mapping between awp.v1's numbers and the
protocol's lower-case names ("waiting_retry"), both ways.

Every state is a StrEnum, so ``task.state == "failed"`` holds as it did when states were
plain strings. A number this SDK does not know (a newer server) is refused loudly with
UnknownEnumValue, never shown as something it is not: upgrade awp_sdk to read it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, TypeVar

from awp.v1 import schedule_pb2, types_pb2
from awp_sdk.errors import InvalidArgument, UnknownEnumValue


class RunState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def done(self) -> bool:
        return self is not RunState.RUNNING


class TaskState(StrEnum):
    PENDING = "pending"
    READY = "ready"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_RETRY = "waiting_retry"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    SKIPPED = "skipped"
    # At a wait (signal, approval, sleep) holding no lease or slot (docs/design.md §16).
    WAITING = "waiting"


class AttemptState(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed_out"
    CANCELED = "canceled"
    # Reached a wait not yet satisfied and released its lease; free of charge.
    SUSPENDED = "suspended"


class CheckpointKind(StrEnum):
    """What a checkpoint (a memo of a task) records, and what a waiting task waits for."""

    STEP = "step"
    SLEEP = "sleep"
    SIGNAL = "signal"
    APPROVAL = "approval"


class DispatchState(StrEnum):
    PENDING = "pending"
    LEASED = "leased"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELED = "canceled"


class WorkerState(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    STOPPED = "stopped"
    OFFLINE = "offline"


class EventType(StrEnum):
    # The server's own word for a type it cannot name (written by a newer version during
    # an upgrade, types.proto): a value it sends, unlike every other enum's UNSPECIFIED.
    UNSPECIFIED = "unspecified"
    RUN_CREATED = "run_created"
    RUN_STATE = "run_state"
    TASK_STATE = "task_state"
    ATTEMPT_STATE = "attempt_state"
    RUN_CANCEL_REQUESTED = "run_cancel_requested"


class FailurePolicy(StrEnum):
    FAIL_RUN = "fail_run"
    CONTINUE = "continue"


class OverlapPolicy(StrEnum):
    """What a schedule's tick does while its previous run still runs (docs/schedules.md)."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"
    CANCEL_PREVIOUS = "cancel_previous"


class CatchupPolicy(StrEnum):
    """Which missed ticks a schedule fires once it can again (docs/schedules.md)."""

    NONE = "none"
    LAST = "last"
    ALL = "all"


E = TypeVar("E", bound=StrEnum)

# Each Python enum, the proto enum it mirrors and that enum's value prefix.
_PROTO: Final[dict[type[StrEnum], tuple[Any, str]]] = {
    RunState: (types_pb2.RunState, "RUN_STATE_"),
    TaskState: (types_pb2.TaskState, "TASK_STATE_"),
    AttemptState: (types_pb2.AttemptState, "ATTEMPT_STATE_"),
    CheckpointKind: (types_pb2.CheckpointKind, "CHECKPOINT_KIND_"),
    DispatchState: (types_pb2.DispatchState, "DISPATCH_STATE_"),
    WorkerState: (types_pb2.WorkerState, "WORKER_STATE_"),
    EventType: (types_pb2.EventType, "EVENT_TYPE_"),
    FailurePolicy: (types_pb2.FailurePolicy, "FAILURE_POLICY_"),
    OverlapPolicy: (schedule_pb2.OverlapPolicy, "OVERLAP_POLICY_"),
    CatchupPolicy: (schedule_pb2.CatchupPolicy, "CATCHUP_POLICY_"),
}


def decode(kind: type[E], number: int) -> E:
    """The member a proto enum number stands for; UnknownEnumValue for a number this SDK
    does not know, and for UNSPECIFIED (0), which the server never sends where a value is
    meant (callers handle the fields where 0 means "none")."""
    proto, prefix = _PROTO[kind]
    try:
        name: str = proto.Name(number)
        return kind(name.removeprefix(prefix).lower())
    except ValueError:
        enum: str = proto.DESCRIPTOR.full_name
        raise UnknownEnumValue(
            f"the server sent {enum} value {number}, which this version of awp_sdk does "
            "not know: upgrade awp_sdk",
            enum=enum,
            value=number,
        ) from None


def encode(kind: type[E], name: str) -> int:
    """The proto enum number of a member or its name ("waiting_retry"); InvalidArgument
    naming the known ones for any other text."""
    proto, prefix = _PROTO[kind]
    try:
        member = kind(str(name).lower())
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise InvalidArgument(
            f"unknown {kind.__name__} {name!r}: expected one of {known}"
        ) from None
    number: int = proto.Value(prefix + member.name)
    return number
