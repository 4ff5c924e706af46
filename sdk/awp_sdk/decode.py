"""The one place the SDK reads the generated messages: each ControlService answer into
its awp_sdk.records value, every enum through awp_sdk.enums (an unknown value raises).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message

from awp.v1 import control_pb2, durable_pb2, limits_pb2, runs_pb2, schedule_pb2, types_pb2
from awp_protocol.jsonvalue import exact_number, struct_to_dict
from awp_sdk import records
from awp_sdk.enums import (
    AttemptState,
    CatchupPolicy,
    CheckpointKind,
    DispatchState,
    EventType,
    FailurePolicy,
    OverlapPolicy,
    RunState,
    TaskState,
    WorkerState,
    decode,
)


def when(stamp: timestamp_pb2.Timestamp) -> datetime | None:
    """An unset timestamp (zero) is None: how the API says "not yet"."""
    if stamp.seconds == 0 and stamp.nanos == 0:
        return None
    # What ToDatetime does, a few times faster (a run has three stamps per task).
    return datetime.fromtimestamp(stamp.seconds, UTC).replace(microsecond=stamp.nanos // 1000)


def span(message: Message, name: str) -> timedelta | None:
    if not message.HasField(name):
        return None
    value: duration_pb2.Duration = getattr(message, name)
    return value.ToTimedelta()


def message_json(message: Message, *, field_names: bool = False) -> dict[str, Any]:
    """The protobuf JSON mapping of a message (camelCase names as grpcurl prints them, or
    the proto's own with field_names), its numbers as JSON says them: a Struct's 1 is 1,
    not the 1.0 of its double."""
    shown = json_format.MessageToDict(message, preserving_proto_field_name=field_names)
    return _exact(shown)  # type: ignore[no-any-return]


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return exact_number(value)
    if isinstance(value, list):
        return [_exact(item) for item in value]
    if isinstance(value, dict):
        return {key: _exact(item) for key, item in value.items()}
    return value


# ---------------------------------------------------------------- runs


def run(message: runs_pb2.Run) -> records.Run:
    return records.Run(
        id=message.id,
        workflow=message.workflow_name,
        version=message.workflow_version,
        state=decode(RunState, message.state),
        input=struct_to_dict(message.input),
        request_id=message.request_id,
        revision=message.revision,
        last_seq=message.last_seq,
        created_at=when(message.created_at),
        finished_at=when(message.finished_at),
        cancel_requested_at=when(message.cancel_requested_at),
        started_by=message.started_by,
        cancel_requested_by=message.cancel_requested_by or None,
        task_counts={decode(TaskState, c.state): c.count for c in message.tasks_by_state},
        retried_from_run_id=message.retried_from_run_id or None,
        retry_from_task=message.retry_from_task or None,
        schedule_id=message.schedule_id or None,
        schedule_tick=when(message.schedule_tick),
        start_time=when(message.start_time),
        trace_id=message.trace_id or None,
        priority=message.priority,
    )


def task_error(error: types_pb2.TaskError) -> records.TaskError:
    return records.TaskError(
        error.message,
        error.retryable,
        error.type or None,
        error.traceback or None,
        error.log_tail or None,
    )


def task_wait(message: durable_pb2.TaskWait) -> records.TaskWait:
    return records.TaskWait(
        kind=decode(CheckpointKind, message.kind),
        name=message.name,
        prompt=message.prompt,
        role=message.role,
        since=when(message.since),
        due_at=when(message.due_at),
        attempt=message.attempt,
    )


def memo_savings(message: types_pb2.MemoSavings) -> records.MemoSavings:
    return records.MemoSavings(
        steps=message.steps, tokens=message.tokens, cost_usd=message.cost_usd
    )


def task(message: runs_pb2.Task) -> records.TaskStatus:
    return records.TaskStatus(
        key=message.key,
        state=decode(TaskState, message.state),
        executor_kind=message.executor_kind,
        action=message.action,
        depends_on=tuple(message.depends_on),
        attempts=message.attempts,
        max_attempts=message.max_attempts,
        output=struct_to_dict(message.output) if message.HasField("output") else None,
        error=task_error(message.error) if message.HasField("error") else None,
        retry_at=when(message.retry_at),
        finished_at=when(message.finished_at),
        reused_from_run_id=message.reused_from_run_id or None,
        output_omitted=message.output_omitted,
        hand_backs=message.hand_backs,
        map_parent=message.map_parent or None,
        map_index=message.map_index if message.map_parent else None,
        wait=task_wait(message.wait) if message.HasField("wait") else None,
        suspensions=message.suspensions,
        saved=memo_savings(message.saved),
        waiting_for=message.waiting_for or None,
    )


def attempt(message: runs_pb2.Attempt) -> records.Attempt:
    return records.Attempt(
        task_key=message.task_key,
        attempt=message.attempt,
        state=decode(AttemptState, message.state),
        worker_id=message.worker_id,
        dispatch_id=message.dispatch_id,
        fencing_token=message.fencing_token,
        started_at=when(message.started_at),
        deadline=when(message.deadline),
        finished_at=when(message.finished_at),
        error=task_error(message.error) if message.HasField("error") else None,
        worker_name=message.worker_name or None,
    )


def run_detail(answer: runs_pb2.GetRunResponse) -> records.RunDetail:
    return records.RunDetail(
        run=run(answer.run),
        tasks={t.key: task(t) for t in answer.tasks},
        attempts=tuple(attempt(a) for a in answer.attempts),
        tasks_omitted=answer.tasks_omitted,
        attempts_omitted=answer.attempts_omitted,
        tracebacks_omitted=answer.tracebacks_omitted,
    )


def task_page(answer: runs_pb2.ListTasksResponse) -> records.TaskPage:
    return records.TaskPage(
        tuple(task(t) for t in answer.tasks), answer.next_page_token, answer.tracebacks_omitted
    )


_TRANSITION_STATES: dict[str, type[RunState] | type[TaskState] | type[AttemptState]] = {
    "run_transition": RunState,
    "task_transition": TaskState,
    "attempt_transition": AttemptState,
}


def event(message: types_pb2.StateEvent) -> records.Event:
    before: RunState | TaskState | AttemptState | None = None
    after: RunState | TaskState | AttemptState | None = None
    which = message.WhichOneof("transition")
    if which is not None:
        change = getattr(message, which)
        kind = _TRANSITION_STATES[which]
        # from UNSPECIFIED: the subject was just created.
        before = decode(kind, change.from_state) if change.from_state else None
        after = decode(kind, change.to_state)
    return records.Event(
        run_id=message.run_id,
        seq=message.seq,
        revision=message.revision,
        type=decode(EventType, message.type),
        task_key=message.task_key or None,
        attempt=message.attempt or None,
        from_state=before,
        to_state=after,
        payload=struct_to_dict(message.payload),
        created_at=when(message.created_at),
    )


def signal_sent(answer: durable_pb2.SendSignalResponse) -> records.SignalSent:
    return records.SignalSent(answer.signal_id, answer.delivered_to or None, answer.duplicate)


def decided(answer: durable_pb2.ApproveResponse | durable_pb2.RejectResponse) -> records.Decided:
    return records.Decided(
        task_state=decode(TaskState, answer.task_state),
        resumed_attempt=answer.resumed_attempt,
        decided_at=when(answer.decided_at),
    )


# ---------------------------------------------------------------- workflows


def _stored_task(message: types_pb2.TaskDefinition) -> records.StoredTask:
    retry = None
    if message.HasField("retry"):
        policy = message.retry
        retry = records.StoredRetry(
            max_attempts=policy.max_attempts or None,
            initial_backoff=span(policy, "initial_backoff"),
            max_backoff=span(policy, "max_backoff"),
            multiplier=policy.backoff_multiplier or None,
        )
    return records.StoredTask(
        key=message.key,
        executor_kind=message.executor_kind,
        action=message.action,
        input=struct_to_dict(message.input),
        depends_on=tuple(message.depends_on),
        retry=retry,
        timeout=span(message, "timeout"),
        map=records.StoredMap(message.map.over, message.map.path)
        if message.HasField("map")
        else None,
        # UNSPECIFIED is FAIL_RUN (types.proto).
        on_failure=decode(FailurePolicy, message.on_failure)
        if message.on_failure
        else FailurePolicy.FAIL_RUN,
        always=message.always,
        concurrency_limits=tuple(
            records.StoredConcurrency(limit.key, limit.max) for limit in message.concurrency_limits
        ),
        rate_limits=tuple(
            records.StoredRateUse(use.limit, use.units) for use in message.rate_limits
        ),
        wait=_stored_wait(message.wait) if message.HasField("wait") else None,
        priority=message.priority,
        required_labels=tuple(message.required_labels),
        preferred_labels=tuple(message.preferred_labels),
        resources=dict(sorted(message.resources.items())),
        sticky=message.sticky,
    )


def _stored_wait(message: types_pb2.WaitTaskDefinition) -> records.StoredWait:
    return records.StoredWait(
        kind=decode(CheckpointKind, message.kind),
        sleep=span(message, "sleep"),
        prompt=message.prompt,
        timeout=span(message, "timeout"),
        role=message.role,
    )


def workflow(message: control_pb2.Workflow) -> records.StoredWorkflow:
    definition = message.definition
    return records.StoredWorkflow(
        name=definition.name,
        version=definition.version,
        description=definition.description,
        concurrency=definition.concurrency,
        tasks=tuple(_stored_task(t) for t in definition.tasks),
        created_at=when(message.created_at),
        definition=message_json(definition, field_names=True),
    )


def applied(answer: control_pb2.CreateWorkflowResponse) -> records.Applied:
    stored = workflow(answer.workflow)
    return records.Applied(stored.name, stored.version, answer.created, stored)


# ---------------------------------------------------------------- fleet


def worker(message: control_pb2.WorkerInfo) -> records.Worker:
    return records.Worker(
        id=message.id,
        name=message.name,
        state=decode(WorkerState, message.state),
        executor_kinds=tuple(message.executor_kinds),
        max_concurrency=message.max_concurrency,
        active_leases=message.active_leases,
        labels=dict(message.labels),
        protocol_version=message.protocol_version,
        registered_at=when(message.registered_at),
        last_heartbeat_at=when(message.last_heartbeat_at),
        stopped_at=when(message.stopped_at),
        models=tuple(message.models),
        resources=dict(sorted(message.resources.items())),
        reserved=dict(sorted(message.reserved.items())),
    )


def stats(answer: control_pb2.GetStatsResponse) -> records.Stats:
    return records.Stats(
        tasks_by_state=tuple(
            records.TaskCount(decode(TaskState, c.state), c.executor_kind, c.count)
            for c in answer.tasks_by_state
        ),
        dispatches_by_state=tuple(
            records.DispatchCount(decode(DispatchState, c.state), c.executor_kind, c.count)
            for c in answer.dispatches_by_state
        ),
        runs_by_state={decode(RunState, c.state): c.count for c in answer.runs_by_state},
        workers_by_state={decode(WorkerState, c.state): c.count for c in answer.workers_by_state},
        active_leases=answer.active_leases,
        oldest_pending=span(answer, "oldest_pending"),
    )


def pruned(answer: control_pb2.PruneRunsResponse) -> records.Pruned:
    return records.Pruned(
        runs=answer.runs,
        tasks=answer.tasks,
        attempts=answer.attempts,
        dispatches=answer.dispatches,
        events=answer.events,
        remaining=answer.remaining,
        cutoff=when(answer.cutoff),
        next_page_token=answer.next_page_token,
    )


def identity(answer: control_pb2.WhoAmIResponse) -> records.Identity:
    return records.Identity(answer.name, frozenset(answer.roles), answer.credentials_required)


def schedule(message: schedule_pb2.Schedule) -> records.Schedule:
    spec = message.spec
    return records.Schedule(
        id=message.id,
        name=spec.name,
        workflow=spec.workflow_name,
        version=spec.workflow_version,
        input=struct_to_dict(spec.input),
        cron=spec.cron or None,
        every=span(spec, "interval"),
        timezone=spec.timezone,
        overlap=decode(OverlapPolicy, spec.overlap),
        catchup=decode(CatchupPolicy, spec.catchup),
        catchup_window=span(spec, "catchup_window"),
        paused=spec.paused,
        next_fire_at=when(message.next_fire_time),
        created_at=when(message.created_at),
        created_by=message.created_by,
        updated_at=when(message.updated_at),
        updated_by=message.updated_by,
        recent_ticks=tuple(
            records.ScheduleTick(
                at=when(t.tick_time),
                source=t.source,
                outcome=t.outcome,
                run_id=t.run_id or None,
                leader_epoch=t.leader_epoch,
                created_at=when(t.created_at),
            )
            for t in message.recent_ticks
        ),
    )


def rate_limit(message: limits_pb2.RateLimit) -> records.RateLimit:
    return records.RateLimit(
        name=message.spec.name,
        units=message.spec.units,
        period=span(message.spec, "period"),
        used=message.used,
        paused_until=when(message.paused_until),
        updated_at=when(message.updated_at),
        updated_by=message.updated_by,
    )


def limits_overview(answer: limits_pb2.ListRateLimitsResponse) -> records.LimitsOverview:
    return records.LimitsOverview(
        limits=tuple(rate_limit(limit) for limit in answer.limits),
        rate_limits_waiting=tuple(
            records.LimitWaiting(w.name, w.waiting) for w in answer.rate_limits_waiting
        ),
        keys_waiting=tuple(records.LimitWaiting(w.name, w.waiting) for w in answer.keys_waiting),
    )
