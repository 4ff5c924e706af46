"""What the server answers, as plain typed values: runs, their tasks and attempts, events.

States are the protocol's lower-case names ("running", "waiting_retry"); a state this
SDK does not know (a newer server) reads "unknown(N)". JSON values (inputs, outputs,
payloads) are what the action returned: integral numbers within 2**53 as int
(awp_protocol.jsonvalue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from awp.v1 import control_pb2, types_pb2
from awp_protocol.jsonvalue import exact_number, struct_to_dict
from awp_protocol.states import TERMINAL_RUN_STATES

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper


def enum_name(enum: _EnumTypeWrapper[Any], prefix: str, value: int) -> str:
    """TASK_STATE_WAITING_RETRY -> "waiting_retry"; an unknown value -> "unknown(N)"."""
    try:
        name = enum.Name(value)
    except ValueError:
        return f"unknown({value})"
    return name.removeprefix(prefix).lower()


def run_state(value: int) -> str:
    return enum_name(types_pb2.RunState, "RUN_STATE_", value)


def task_state(value: int) -> str:
    return enum_name(types_pb2.TaskState, "TASK_STATE_", value)


def attempt_state(value: int) -> str:
    return enum_name(types_pb2.AttemptState, "ATTEMPT_STATE_", value)


def message_json(message: Message) -> dict[str, Any]:
    """The protobuf JSON mapping of a message (camelCase names, as grpcurl prints it), its
    numbers as JSON says them: a Struct's 1 is 1, not the 1.0 of its double."""
    return _exact(json_format.MessageToDict(message))  # type: ignore[no-any-return]


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return exact_number(value)
    if isinstance(value, list):
        return [_exact(item) for item in value]
    if isinstance(value, dict):
        return {key: _exact(item) for key, item in value.items()}
    return value


def when(stamp: timestamp_pb2.Timestamp) -> datetime | None:
    """An unset timestamp (zero) is None: how the API says "not yet"."""
    if stamp.seconds == 0 and stamp.nanos == 0:
        return None
    return stamp.ToDatetime(tzinfo=UTC)


@dataclass(frozen=True)
class Run:
    """One run, as ListRuns and GetRun describe it."""

    id: str
    workflow: str
    version: int
    state: str
    input: dict[str, Any]
    request_id: str
    revision: int
    last_seq: int
    created_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    started_by: str
    # How many tasks are in each state, in lifecycle order.
    task_counts: dict[str, int] = field(default_factory=dict)
    # Set when Client.retry started this run: the run it retried, and its from_task.
    retried_from_run_id: str | None = None
    retry_from_task: str | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_RUN_STATES

    @classmethod
    def from_proto(cls, run: control_pb2.Run) -> Run:
        return cls(
            id=run.id,
            workflow=run.workflow_name,
            version=run.workflow_version,
            state=run_state(run.state),
            input=struct_to_dict(run.input),
            request_id=run.request_id,
            revision=run.revision,
            last_seq=run.last_seq,
            created_at=when(run.created_at),
            finished_at=when(run.finished_at),
            cancel_requested_at=when(run.cancel_requested_at),
            started_by=run.started_by,
            task_counts={task_state(c.state): c.count for c in run.tasks_by_state},
            retried_from_run_id=run.retried_from_run_id or None,
            retry_from_task=run.retry_from_task or None,
        )


@dataclass(frozen=True)
class TaskError:
    """Why a task or attempt failed: the message, whether a retry may help, and what the
    worker kept of the exception (its type, traceback and the action's last log lines;
    None when it sent none, e.g. a lost lease or a worker in another language)."""

    message: str
    retryable: bool
    type: str | None = None
    traceback: str | None = None
    log_tail: str | None = None

    @classmethod
    def from_proto(cls, error: types_pb2.TaskError) -> TaskError:
        return cls(
            error.message,
            error.retryable,
            error.type or None,
            error.traceback or None,
            error.log_tail or None,
        )


@dataclass(frozen=True)
class TaskStatus:
    """One task of a run: its state, output (once succeeded) or error."""

    key: str
    state: str
    executor_kind: str
    action: str
    depends_on: tuple[str, ...]
    attempts: int
    max_attempts: int
    output: dict[str, Any] | None
    error: TaskError | None
    retry_at: datetime | None
    finished_at: datetime | None
    # Set when a retry reused this task's output instead of running it: the run it came from.
    reused_from_run_id: str | None = None

    @classmethod
    def from_proto(cls, task: control_pb2.Task) -> TaskStatus:
        return cls(
            key=task.key,
            state=task_state(task.state),
            executor_kind=task.executor_kind,
            action=task.action,
            depends_on=tuple(task.depends_on),
            attempts=task.attempts,
            max_attempts=task.max_attempts,
            output=struct_to_dict(task.output) if task.HasField("output") else None,
            error=TaskError.from_proto(task.error) if task.HasField("error") else None,
            retry_at=when(task.retry_at),
            finished_at=when(task.finished_at),
            reused_from_run_id=task.reused_from_run_id or None,
        )


@dataclass(frozen=True)
class Attempt:
    """One execution of a task by a worker."""

    task_key: str
    attempt: int
    state: str
    worker_id: str
    worker_name: str
    fencing_token: int
    started_at: datetime | None
    finished_at: datetime | None
    error: TaskError | None

    @classmethod
    def from_proto(cls, attempt: control_pb2.Attempt) -> Attempt:
        return cls(
            task_key=attempt.task_key,
            attempt=attempt.attempt,
            state=attempt_state(attempt.state),
            worker_id=attempt.worker_id,
            worker_name=attempt.worker_name,
            fencing_token=attempt.fencing_token,
            started_at=when(attempt.started_at),
            finished_at=when(attempt.finished_at),
            error=TaskError.from_proto(attempt.error) if attempt.HasField("error") else None,
        )


@dataclass(frozen=True)
class RunDetail:
    """A run with its tasks (by key, in definition order) and attempts. A run past
    10,000 tasks (map elements) has the rest counted in tasks_omitted: Client.list_tasks
    yields them all."""

    run: Run
    tasks: dict[str, TaskStatus]
    attempts: tuple[Attempt, ...]
    tasks_omitted: int = 0

    @classmethod
    def from_proto(cls, answer: control_pb2.GetRunResponse) -> RunDetail:
        return cls(
            run=Run.from_proto(answer.run),
            tasks={t.key: TaskStatus.from_proto(t) for t in answer.tasks},
            attempts=tuple(Attempt.from_proto(a) for a in answer.attempts),
            tasks_omitted=answer.tasks_omitted,
        )

    def outputs(self) -> dict[str, dict[str, Any]]:
        """The output of every task that succeeded, by task key."""
        return {
            key: task.output
            for key, task in self.tasks.items()
            if task.state == "succeeded" and task.output is not None
        }


@dataclass(frozen=True)
class Event:
    """One state change of a run (a StateEvent). ``type`` is "run_created", "run_state",
    "task_state", "attempt_state" or "run_cancel_requested"; the subject's states before
    and after are in ``from_state``/``to_state`` (from_state None: just created)."""

    run_id: str
    seq: int
    revision: int
    type: str
    task_key: str | None
    attempt: int | None
    from_state: str | None
    to_state: str | None
    payload: dict[str, Any]
    created_at: datetime | None

    @classmethod
    def from_proto(cls, event: types_pb2.StateEvent) -> Event:
        before: str | None = None
        after: str | None = None
        which = event.WhichOneof("transition")
        if which is not None:
            change = getattr(event, which)
            name = {
                "run_transition": run_state,
                "task_transition": task_state,
                "attempt_transition": attempt_state,
            }[which]
            before = name(change.from_state) if change.from_state else None
            after = name(change.to_state)
        return cls(
            run_id=event.run_id,
            seq=event.seq,
            revision=event.revision,
            type=enum_name(types_pb2.EventType, "EVENT_TYPE_", event.type),
            task_key=event.task_key or None,
            attempt=event.attempt or None,
            from_state=before,
            to_state=after,
            payload=struct_to_dict(event.payload),
            created_at=when(event.created_at),
        )
