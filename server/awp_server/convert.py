"""Conversions between the awp.v1 protobuf messages and kernel specs / storage rows.

Every enum mapping lives here once: storage speaks the lower-case state names of
awp_protocol.states ('waiting_retry'), the API speaks TASK_STATE_WAITING_RETRY.

Struct <-> JSON is protocol vocabulary: awp_protocol.jsonvalue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar
from uuid import UUID

from google.protobuf import duration_pb2, timestamp_pb2

from awp.v1 import control_pb2, durable_pb2, limits_pb2, runs_pb2, types_pb2
from awp_db.attempts import AttemptDetail
from awp_db.events import StoredEvent
from awp_db.runs import AttemptInfo, RunInfo, TaskInfo
from awp_db.stats import StateCount, Stats
from awp_db.workers import WorkerInfo
from awp_db.workflows import StoredWorkflow
from awp_kernel.definition import (
    FAILURE_POLICIES,
    WorkflowSpec,
)
from awp_kernel.errors import invalid
from awp_kernel.wait_tasks import WaitTaskSpec
from awp_protocol import states
from awp_protocol.jsonvalue import dict_to_struct
from awp_protocol.results import StoredError

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

V = TypeVar("V", bound=int)


# ---------------------------------------------------------------- enums


@dataclass(frozen=True, slots=True)
class EnumMap(Generic[V]):
    """Lower-case storage state <-> proto enum value, both ways."""

    to_proto: Mapping[str, V]
    from_proto: Mapping[int, str]
    unspecified: V

    def proto(self, state: str) -> V:
        return self.to_proto[state]

    def proto_or_unspecified(self, state: str | None) -> V:
        """None (no state yet: the subject was just created) is the enum's zero value."""
        return self.unspecified if state is None else self.to_proto[state]

    def name(self, value: int) -> str | None:
        """The storage name of a proto value; None for UNSPECIFIED or unknown values."""
        return self.from_proto.get(value)


def enum_map(enum: _EnumTypeWrapper[V], prefix: str, names: Sequence[str]) -> EnumMap[V]:
    # Derived from the kernel's state lists, so a state added there without its proto
    # counterpart fails at import, not on the first row that carries it.
    to_proto = {name: enum.Value(prefix + name.upper().replace(".", "_")) for name in names}
    return EnumMap(
        to_proto,
        {int(value): name for name, value in to_proto.items()},
        enum.Value(prefix + "UNSPECIFIED"),
    )


RUN_STATES: Final = enum_map(types_pb2.RunState, "RUN_STATE_", states.RUN_STATES)
TASK_STATES: Final = enum_map(types_pb2.TaskState, "TASK_STATE_", states.TASK_STATES)
ATTEMPT_STATES: Final = enum_map(types_pb2.AttemptState, "ATTEMPT_STATE_", states.ATTEMPT_STATES)
CHECKPOINT_KINDS: Final = enum_map(
    types_pb2.CheckpointKind, "CHECKPOINT_KIND_", states.CHECKPOINT_KINDS
)
DISPATCH_STATES: Final = enum_map(
    types_pb2.DispatchState, "DISPATCH_STATE_", states.DISPATCH_STATES
)
WORKER_STATES: Final = enum_map(types_pb2.WorkerState, "WORKER_STATE_", states.WORKER_STATES)
FAILURE_POLICY: Final = enum_map(types_pb2.FailurePolicy, "FAILURE_POLICY_", FAILURE_POLICIES)
# Storage names an event type by its subject, a dot and the rest: 'run.cancel_requested'
# is EVENT_TYPE_RUN_CANCEL_REQUESTED. The proto enum is the list's one home.
EVENT_TYPES: Final = enum_map(
    types_pb2.EventType,
    "EVENT_TYPE_",
    [
        ".".join(name.removeprefix("EVENT_TYPE_").lower().split("_", 1))
        for name, _ in types_pb2.EventType.items()
        if name != "EVENT_TYPE_UNSPECIFIED"
    ],
)


# ---------------------------------------------------------------- scalars


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """None stays None: an unset message field, which is how the API says 'not yet'."""
    if moment is None:
        return None
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


def instant(field: str, value: timestamp_pb2.Timestamp) -> datetime:
    """A request's Timestamp as an aware datetime; INVALID_ARGUMENT naming the field when
    it is not a valid one (nanos out of range, beyond year 9999)."""
    try:
        return value.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise invalid(field, "is not a valid google.protobuf.Timestamp") from None


def duration_from_ms(ms: float) -> duration_pb2.Duration:
    """Durations the server sends are never negative: a deadline already past is 'zero left'."""
    value = duration_pb2.Duration()
    value.FromMilliseconds(max(0, int(ms)))
    return value


# ---------------------------------------------------------------- workflow definitions


def spec_to_proto(spec: WorkflowSpec) -> types_pb2.WorkflowDefinition:
    """Every default spelled out: what is stored is what runs."""
    return types_pb2.WorkflowDefinition(
        name=spec.name,
        version=spec.version,
        description=spec.description,
        concurrency=spec.concurrency,
        tasks=[
            types_pb2.TaskDefinition(
                key=task.key,
                executor_kind=task.executor_kind,
                action=task.action,
                input=dict_to_struct(task.input),
                depends_on=task.depends_on,
                retry=types_pb2.RetryPolicy(
                    max_attempts=task.retry.max_attempts,
                    initial_backoff=duration_from_ms(task.retry.initial_backoff_ms),
                    max_backoff=duration_from_ms(task.retry.max_backoff_ms),
                    backoff_multiplier=task.retry.multiplier,
                ),
                timeout=duration_from_ms(task.timeout_ms),
                map=(
                    None
                    if task.map is None
                    else types_pb2.TaskMap(over=task.map.over, path=task.map.path)
                ),
                on_failure=FAILURE_POLICY.proto(task.on_failure),
                always=task.always,
                concurrency_limits=[
                    limits_pb2.ConcurrencyLimit(key=limit.key, max=limit.max)
                    for limit in task.concurrency_limits
                ],
                rate_limits=[
                    limits_pb2.RateUse(limit=use.limit, units=use.units) for use in task.rate_limits
                ],
                wait=None if task.wait is None else _wait_task(task.wait),
                priority=task.priority,
                required_labels=task.placement.required_labels,
                preferred_labels=task.placement.preferred_labels,
                resources=dict(task.placement.resources),
                sticky=task.placement.sticky,
            )
            for task in spec.tasks
        ],
    )


def _wait_task(wait: WaitTaskSpec) -> types_pb2.WaitTaskDefinition:
    return types_pb2.WaitTaskDefinition(
        kind=CHECKPOINT_KINDS.proto(wait.kind),
        sleep=None if wait.sleep_ms is None else duration_from_ms(wait.sleep_ms),
        prompt=wait.prompt,
        timeout=None if wait.timeout_ms is None else duration_from_ms(wait.timeout_ms),
        role=wait.role,
    )


def workflow_to_proto(workflow: StoredWorkflow) -> control_pb2.Workflow:
    return control_pb2.Workflow(
        definition=spec_to_proto(workflow.spec), created_at=timestamp(workflow.created_at)
    )


# ---------------------------------------------------------------- runs, tasks, attempts, events


def run_to_proto(row: RunInfo, task_counts: Mapping[str, int]) -> runs_pb2.Run:
    """A row of the runs queries (runs.get / runs.list_page) and its task counts."""
    return runs_pb2.Run(
        id=str(row.id),
        workflow_name=row.workflow_name,
        workflow_version=row.workflow_version,
        state=RUN_STATES.proto(row.state),
        revision=row.revision,
        input=dict_to_struct(row.input),
        request_id=row.request_id or "",
        created_at=timestamp(row.created_at),
        finished_at=timestamp(row.finished_at),
        cancel_requested_at=timestamp(row.cancel_requested_at),
        last_seq=row.last_seq,
        # In the enum's (lifecycle) order, as GetStats lists its counts.
        tasks_by_state=[
            runs_pb2.TaskStateCount(state=TASK_STATES.proto(state), count=n)
            for state, n in sorted(task_counts.items(), key=lambda item: TASK_STATES.proto(item[0]))
        ],
        started_by=row.started_by or "",
        cancel_requested_by=row.cancel_requested_by or "",
        retried_from_run_id=_id_text(row.retried_from),
        retry_from_task=row.retry_from_task or "",
        schedule_id=_id_text(row.schedule_id),
        schedule_tick=timestamp(row.schedule_tick),
        start_time=timestamp(row.start_at),
        trace_id=row.trace_id or "",
        priority=row.priority,
    )


def _id_text(value: UUID | None) -> str:
    return "" if value is None else str(value)


def task_error(
    error: Mapping[str, Any] | None, traceback: str | None = None, log_tail: str | None = None
) -> types_pb2.TaskError | None:
    """Storage keeps a task's or attempt's error as an awp_protocol.results.StoredError,
    a failed attempt's traceback and log tail apart."""
    if error is None:
        return None
    stored = StoredError.from_json(error)
    return types_pb2.TaskError(
        message=stored.message,
        retryable=stored.retryable,
        type=stored.type,
        traceback=traceback or "",
        log_tail=log_tail or "",
    )


def task_to_proto(
    row: TaskInfo, traceback: str | None = None, waiting_for: str = ""
) -> runs_pb2.Task:
    """A task row; traceback: its last attempt's, for a failed task (GetRun); waiting_for:
    why a ready task is held back (awp_db.grant.explain)."""
    return runs_pb2.Task(
        waiting_for=waiting_for,
        key=row.key,
        state=TASK_STATES.proto(row.state),
        executor_kind=row.executor_kind,
        action=row.action,
        depends_on=row.depends_on,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        output=dict_to_struct(row.output),
        output_omitted=row.output_omitted,
        error=task_error(row.error, traceback),
        retry_at=timestamp(row.retry_at),
        finished_at=timestamp(row.finished_at),
        reused_from_run_id=_id_text(row.reused_from_run_id),
        hand_backs=row.hand_backs,
        map_parent=row.map_parent or "",
        map_index=row.map_index or 0,
        saved=types_pb2.MemoSavings(
            steps=row.saved_steps, tokens=row.saved_tokens, cost_usd=row.saved_cost_usd
        ),
        suspensions=row.suspensions,
        wait=_task_wait(row),
    )


def _task_wait(row: TaskInfo) -> durable_pb2.TaskWait | None:
    if row.wait_kind is None:
        return None
    return durable_pb2.TaskWait(
        kind=CHECKPOINT_KINDS.proto(row.wait_kind),
        name=row.wait_name or "",
        prompt=row.wait_prompt or "",
        role=row.wait_role or "",
        since=timestamp(row.wait_since),
        due_at=timestamp(row.wait_due_at),
        attempt=row.wait_attempt or 0,
    )


def attempt_to_proto(row: AttemptInfo) -> runs_pb2.Attempt:
    return runs_pb2.Attempt(
        task_key=row.task_key,
        attempt=row.attempt,
        state=ATTEMPT_STATES.proto(row.state),
        worker_id=str(row.worker_id),
        dispatch_id=row.dispatch_id,
        fencing_token=row.fencing_token,
        started_at=timestamp(row.started_at),
        deadline=timestamp(row.deadline),
        finished_at=timestamp(row.finished_at),
        error=task_error(row.error),
    )


def attempt_detail_to_proto(row: AttemptDetail) -> runs_pb2.Attempt:
    """An attempt with everything it kept (ListAttempts)."""
    return runs_pb2.Attempt(
        task_key=row.task_key,
        attempt=row.attempt,
        state=ATTEMPT_STATES.proto(row.state),
        worker_id=str(row.worker_id),
        worker_name=row.worker_name,
        dispatch_id=row.dispatch_id,
        fencing_token=row.fencing_token,
        started_at=timestamp(row.started_at),
        deadline=timestamp(row.deadline),
        finished_at=timestamp(row.finished_at),
        error=task_error(row.error, row.traceback, row.log_tail),
    )


def event_to_proto(row: StoredEvent) -> types_pb2.StateEvent:
    """A stored event; one of a type this server cannot name (written by a newer version
    during an upgrade) goes out as EVENT_TYPE_UNSPECIFIED, without a transition."""
    event_type = EVENT_TYPES.to_proto.get(row.type, types_pb2.EVENT_TYPE_UNSPECIFIED)
    event = types_pb2.StateEvent(
        run_id=str(row.run_id),
        seq=row.seq,
        revision=row.revision,
        type=event_type,
        task_key=row.task_key or "",
        attempt=row.attempt or 0,
        payload=dict_to_struct(row.payload),
        created_at=timestamp(row.created_at),
    )
    before, after = row.from_state, row.to_state
    if event_type == types_pb2.EVENT_TYPE_UNSPECIFIED or after is None:
        return event  # unknown, or a request (run.cancel_requested): no change of state
    # The event type's subject (what it names before the dot) decides the transition.
    subject = row.type.partition(".")[0]
    if subject == "run":
        event.run_transition.from_state = RUN_STATES.proto_or_unspecified(before)
        event.run_transition.to_state = RUN_STATES.proto(after)
    elif subject == "task":
        event.task_transition.from_state = TASK_STATES.proto_or_unspecified(before)
        event.task_transition.to_state = TASK_STATES.proto(after)
    elif subject == "attempt":
        event.attempt_transition.from_state = ATTEMPT_STATES.proto_or_unspecified(before)
        event.attempt_transition.to_state = ATTEMPT_STATES.proto(after)
    else:
        raise ValueError(f"event type {row.type!r} has no transition in the API")
    return event


# ---------------------------------------------------------------- workers and stats


def worker_to_proto(row: WorkerInfo) -> control_pb2.WorkerInfo:
    return control_pb2.WorkerInfo(
        id=str(row.id),
        name=row.name,
        state=WORKER_STATES.proto(row.state),
        executor_kinds=row.executor_kinds,
        max_concurrency=row.max_concurrency,
        active_leases=row.active_leases,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        protocol_version=row.protocol_version,
        registered_at=timestamp(row.registered_at),
        last_heartbeat_at=timestamp(row.last_heartbeat_at),
        stopped_at=timestamp(row.stopped_at),
        models=row.models,
        resources=dict(zip(row.resource_names, row.resource_units, strict=True)),
        reserved=dict(zip(row.resource_names, row.resource_reserved, strict=True)),
    )


def _by_state(counts: Iterable[StateCount], states: EnumMap[V]) -> list[StateCount]:
    """The API lists counts in the enum's (lifecycle) order, then by executor kind."""
    return sorted(counts, key=lambda c: (states.proto(c.state), c.executor_kind or ""))


def stats_to_proto(stats: Stats) -> control_pb2.GetStatsResponse:
    answer = control_pb2.GetStatsResponse
    return answer(
        tasks_by_state=[
            answer.TaskCount(
                state=TASK_STATES.proto(c.state), executor_kind=c.executor_kind or "", count=c.count
            )
            for c in _by_state(stats.tasks, TASK_STATES)
        ],
        dispatches_by_state=[
            answer.DispatchCount(
                state=DISPATCH_STATES.proto(c.state),
                executor_kind=c.executor_kind or "",
                count=c.count,
            )
            for c in _by_state(stats.dispatches, DISPATCH_STATES)
        ],
        runs_by_state=[
            answer.RunCount(state=RUN_STATES.proto(c.state), count=c.count)
            for c in _by_state(stats.runs, RUN_STATES)
        ],
        workers_by_state=[
            answer.WorkerCount(state=WORKER_STATES.proto(c.state), count=c.count)
            for c in _by_state(stats.workers, WORKER_STATES)
        ],
        active_leases=stats.active_leases,
        # Unset when nothing is pending: "no queue", not "a queue of age zero".
        oldest_pending=(
            None if stats.oldest_pending_ms is None else duration_from_ms(stats.oldest_pending_ms)
        ),
    )
