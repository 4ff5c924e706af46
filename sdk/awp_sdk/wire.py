"""Records as the API's protobuf JSON mapping: what grpcurl prints for the same answer
(camelCase names, enum names, RFC 3339 times, defaults left out), so a client that shows
records (`awp ... --json`) keeps the wire's shape without reading the generated messages.

Each function takes what an AsyncClient method answered and gives the JSON of the
response it came from. The records are put back into their messages here, the inverse of
awp_sdk.decode, then printed by its one JSON rule (decode.message_json).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2

from awp.v1 import control_pb2, durable_pb2, limits_pb2, runs_pb2, schedule_pb2, types_pb2
from awp_protocol.jsonvalue import to_struct
from awp_sdk import records
from awp_sdk.decode import message_json
from awp_sdk.enums import (
    AttemptState,
    CatchupPolicy,
    CheckpointKind,
    OverlapPolicy,
    RunState,
    TaskState,
    encode,
)

_Json = dict[str, Any]


def _stamp(target: timestamp_pb2.Timestamp, value: datetime | None) -> None:
    if value is not None:
        target.FromDatetime(value)


def _span(target: duration_pb2.Duration, value: timedelta | None) -> None:
    if value is not None:
        target.FromTimedelta(value)


def _struct(target: struct_pb2.Struct, value: Mapping[str, Any] | None) -> None:
    if value is not None:
        target.CopyFrom(to_struct(value, "value"))


# ---------------------------------------------------------------- messages


def _run(run: records.Run) -> runs_pb2.Run:
    message = runs_pb2.Run(
        id=run.id,
        workflow_name=run.workflow,
        workflow_version=run.version,
        state=encode(RunState, run.state),  # type: ignore[arg-type]
        request_id=run.request_id,
        revision=run.revision,
        last_seq=run.last_seq,
        started_by=run.started_by,
        cancel_requested_by=run.cancel_requested_by or "",
        retried_from_run_id=run.retried_from_run_id or "",
        retry_from_task=run.retry_from_task or "",
        schedule_id=run.schedule_id or "",
        trace_id=run.trace_id or "",
        priority=run.priority,
    )
    _struct(message.input, run.input)
    _stamp(message.created_at, run.created_at)
    _stamp(message.schedule_tick, run.schedule_tick)
    _stamp(message.start_time, run.start_time)
    _stamp(message.finished_at, run.finished_at)
    _stamp(message.cancel_requested_at, run.cancel_requested_at)
    for state, count in run.task_counts.items():
        message.tasks_by_state.add(state=encode(TaskState, state), count=count)
    return message


def _error(target: types_pb2.TaskError, error: records.TaskError | None) -> None:
    if error is not None:
        target.CopyFrom(
            types_pb2.TaskError(
                message=error.message,
                retryable=error.retryable,
                type=error.type or "",
                traceback=error.traceback or "",
                log_tail=error.log_tail or "",
            )
        )


def _wait(target: durable_pb2.TaskWait, wait: records.TaskWait | None) -> None:
    if wait is None:
        return
    target.SetInParent()
    target.kind = encode(CheckpointKind, wait.kind)  # type: ignore[assignment]
    target.name = wait.name
    target.prompt = wait.prompt
    target.role = wait.role
    target.attempt = wait.attempt
    _stamp(target.since, wait.since)
    _stamp(target.due_at, wait.due_at)


def _task(task: records.TaskStatus) -> runs_pb2.Task:
    message = runs_pb2.Task(
        key=task.key,
        state=encode(TaskState, task.state),  # type: ignore[arg-type]
        executor_kind=task.executor_kind,
        action=task.action,
        depends_on=task.depends_on,
        attempts=task.attempts,
        max_attempts=task.max_attempts,
        reused_from_run_id=task.reused_from_run_id or "",
        output_omitted=task.output_omitted,
        hand_backs=task.hand_backs,
        map_parent=task.map_parent or "",
        map_index=task.map_index or 0,
        suspensions=task.suspensions,
        waiting_for=task.waiting_for or "",
    )
    # Sent for every task, zeros included (convert.task_to_proto).
    message.saved.CopyFrom(
        types_pb2.MemoSavings(
            steps=task.saved.steps, tokens=task.saved.tokens, cost_usd=task.saved.cost_usd
        )
    )
    _wait(message.wait, task.wait)
    _struct(message.output, task.output)
    _error(message.error, task.error)
    _stamp(message.retry_at, task.retry_at)
    _stamp(message.finished_at, task.finished_at)
    return message


def _attempt(attempt: records.Attempt) -> runs_pb2.Attempt:
    message = runs_pb2.Attempt(
        task_key=attempt.task_key,
        attempt=attempt.attempt,
        state=encode(AttemptState, attempt.state),  # type: ignore[arg-type]
        worker_id=attempt.worker_id,
        dispatch_id=attempt.dispatch_id,
        fencing_token=attempt.fencing_token,
        worker_name=attempt.worker_name or "",
    )
    _stamp(message.started_at, attempt.started_at)
    _stamp(message.deadline, attempt.deadline)
    _stamp(message.finished_at, attempt.finished_at)
    _error(message.error, attempt.error)
    return message


def _workflow(workflow: records.StoredWorkflow) -> control_pb2.Workflow:
    message = control_pb2.Workflow()
    json_format.ParseDict(workflow.definition, message.definition)
    _stamp(message.created_at, workflow.created_at)
    return message


def _worker(worker: records.Worker) -> control_pb2.WorkerInfo:
    message = control_pb2.WorkerInfo(
        id=worker.id,
        name=worker.name,
        state=encode(type(worker.state), worker.state),  # type: ignore[arg-type]
        executor_kinds=worker.executor_kinds,
        max_concurrency=worker.max_concurrency,
        active_leases=worker.active_leases,
        labels=dict(worker.labels),
        protocol_version=worker.protocol_version,
        models=worker.models,
        resources=dict(worker.resources),
        reserved=dict(worker.reserved),
    )
    _stamp(message.registered_at, worker.registered_at)
    _stamp(message.last_heartbeat_at, worker.last_heartbeat_at)
    _stamp(message.stopped_at, worker.stopped_at)
    return message


def _schedule(schedule: records.Schedule) -> schedule_pb2.Schedule:
    spec = schedule_pb2.ScheduleSpec(
        name=schedule.name,
        workflow_name=schedule.workflow,
        workflow_version=schedule.version,
        cron=schedule.cron or "",
        timezone=schedule.timezone,
        overlap=encode(OverlapPolicy, schedule.overlap),  # type: ignore[arg-type]
        catchup=encode(CatchupPolicy, schedule.catchup),  # type: ignore[arg-type]
        paused=schedule.paused,
    )
    _struct(spec.input, schedule.input)
    _span(spec.interval, schedule.every)
    _span(spec.catchup_window, schedule.catchup_window)
    message = schedule_pb2.Schedule(
        spec=spec,
        id=schedule.id,
        created_by=schedule.created_by,
        updated_by=schedule.updated_by,
    )
    _stamp(message.next_fire_time, schedule.next_fire_at)
    _stamp(message.created_at, schedule.created_at)
    _stamp(message.updated_at, schedule.updated_at)
    for tick in schedule.recent_ticks:
        shown = message.recent_ticks.add(
            source=tick.source,
            outcome=tick.outcome,
            run_id=tick.run_id or "",
            leader_epoch=tick.leader_epoch,
        )
        _stamp(shown.tick_time, tick.at)
        _stamp(shown.created_at, tick.created_at)
    return message


# ---------------------------------------------------------------- answers


def workflow(stored: records.StoredWorkflow) -> _Json:
    """A Workflow: what `awp workflow apply` takes back."""
    return message_json(_workflow(stored))


def applied(answer: records.Applied) -> _Json:
    message = control_pb2.CreateWorkflowResponse(created=answer.created)
    if answer.workflow is not None:
        message.workflow.CopyFrom(_workflow(answer.workflow))
    return message_json(message)


def workflows(found: Iterable[records.StoredWorkflow], next_page_token: str = "") -> _Json:
    message = control_pb2.ListWorkflowsResponse(
        workflows=map(_workflow, found), next_page_token=next_page_token
    )
    return message_json(message)


def started(run: records.Run, created: bool) -> _Json:
    """StartRun's (and RetryRun's, alike) answer."""
    return message_json(runs_pb2.StartRunResponse(run=_run(run), created=created))


def run(run: records.Run) -> _Json:
    """An answer holding the run alone (CancelRun's)."""
    return message_json(runs_pb2.CancelRunResponse(run=_run(run)))


def run_detail(detail: records.RunDetail) -> _Json:
    message = runs_pb2.GetRunResponse(
        run=_run(detail.run),
        tasks=map(_task, detail.tasks.values()),
        attempts=map(_attempt, detail.attempts),
        tasks_omitted=detail.tasks_omitted,
        attempts_omitted=detail.attempts_omitted,
        tracebacks_omitted=detail.tracebacks_omitted,
    )
    return message_json(message)


def runs(found: Iterable[records.Run], next_page_token: str = "") -> _Json:
    message = runs_pb2.ListRunsResponse(runs=map(_run, found), next_page_token=next_page_token)
    return message_json(message)


def tasks(
    found: Iterable[records.TaskStatus], next_page_token: str = "", tracebacks_omitted: int = 0
) -> _Json:
    message = runs_pb2.ListTasksResponse(
        tasks=map(_task, found),
        next_page_token=next_page_token,
        tracebacks_omitted=tracebacks_omitted,
    )
    return message_json(message)


def attempts(found: Iterable[records.Attempt], next_page_token: str = "") -> _Json:
    message = runs_pb2.ListAttemptsResponse(
        attempts=map(_attempt, found), next_page_token=next_page_token
    )
    return message_json(message)


_TRANSITION = {RunState: "run_transition", TaskState: "task_transition"}


def event(event: records.Event) -> _Json:
    """A StateEvent, as WatchRun sends it."""
    message = types_pb2.StateEvent(
        run_id=event.run_id,
        seq=event.seq,
        revision=event.revision,
        type=encode(type(event.type), event.type),  # type: ignore[arg-type]
        task_key=event.task_key or "",
        attempt=event.attempt or 0,
    )
    if event.to_state is not None:
        kind = type(event.to_state)
        change = getattr(message, _TRANSITION.get(kind, "attempt_transition"))
        change.to_state = encode(kind, event.to_state)
        if event.from_state is not None:
            change.from_state = encode(kind, event.from_state)
    if event.payload:
        _struct(message.payload, event.payload)
    _stamp(message.created_at, event.created_at)
    return message_json(message)


def signal_sent(sent: records.SignalSent) -> _Json:
    message = durable_pb2.SendSignalResponse(
        signal_id=sent.signal_id, delivered_to=sent.delivered_to or "", duplicate=sent.duplicate
    )
    return message_json(message)


def decided(decided: records.Decided) -> _Json:
    """Approve's answer (Reject's prints alike)."""
    message = durable_pb2.ApproveResponse(
        task_state=encode(TaskState, decided.task_state),  # type: ignore[arg-type]
        resumed_attempt=decided.resumed_attempt,
    )
    _stamp(message.decided_at, decided.decided_at)
    return message_json(message)


def workers(found: Iterable[records.Worker]) -> _Json:
    return message_json(control_pb2.ListWorkersResponse(workers=map(_worker, found)))


def stats(stats: records.Stats) -> _Json:
    message = control_pb2.GetStatsResponse(active_leases=stats.active_leases)
    for t in stats.tasks_by_state:
        message.tasks_by_state.add(
            state=encode(type(t.state), t.state),
            executor_kind=t.executor_kind,
            count=t.count,
        )
    for d in stats.dispatches_by_state:
        message.dispatches_by_state.add(
            state=encode(type(d.state), d.state),
            executor_kind=d.executor_kind,
            count=d.count,
        )
    for state, count in stats.runs_by_state.items():
        message.runs_by_state.add(state=encode(RunState, state), count=count)
    for worker_state, count in stats.workers_by_state.items():
        message.workers_by_state.add(
            state=encode(type(worker_state), worker_state),
            count=count,
        )
    _span(message.oldest_pending, stats.oldest_pending)
    return message_json(message)


def pruned(pruned: records.Pruned) -> _Json:
    message = control_pb2.PruneRunsResponse(
        runs=pruned.runs,
        tasks=pruned.tasks,
        attempts=pruned.attempts,
        dispatches=pruned.dispatches,
        events=pruned.events,
        remaining=pruned.remaining,
        next_page_token=pruned.next_page_token,
    )
    _stamp(message.cutoff, pruned.cutoff)
    return message_json(message)


def schedule(schedule: records.Schedule) -> _Json:
    """An answer holding the schedule alone (GetSchedule's; Create, Update, Pause and
    Resume answer alike)."""
    return message_json(schedule_pb2.GetScheduleResponse(schedule=_schedule(schedule)))


def schedules(found: Iterable[records.Schedule], next_page_token: str = "") -> _Json:
    message = schedule_pb2.ListSchedulesResponse(
        schedules=map(_schedule, found), next_page_token=next_page_token
    )
    return message_json(message)


def backfilled(run_ids: Iterable[str], already_fired: int) -> _Json:
    message = schedule_pb2.BackfillScheduleResponse(run_ids=run_ids, already_fired=already_fired)
    return message_json(message)


def schedule_deleted() -> _Json:
    return message_json(schedule_pb2.DeleteScheduleResponse())


def triggered(run: records.Run) -> _Json:
    """TriggerSchedule's answer, from the run the tick started."""
    message = schedule_pb2.TriggerScheduleResponse(run_id=run.id)
    _stamp(message.tick_time, run.schedule_tick)
    return message_json(message)


def _rate_limit(limit: records.RateLimit) -> limits_pb2.RateLimit:
    message = limits_pb2.RateLimit(
        spec=limits_pb2.RateLimitSpec(name=limit.name, units=limit.units),
        used=limit.used,
        updated_by=limit.updated_by,
    )
    _span(message.spec.period, limit.period)
    _stamp(message.paused_until, limit.paused_until)
    _stamp(message.updated_at, limit.updated_at)
    return message


def rate_limit(limit: records.RateLimit) -> _Json:
    """An answer holding the limit alone (GetRateLimit's; SetRateLimit answers alike)."""
    return message_json(limits_pb2.GetRateLimitResponse(limit=_rate_limit(limit)))


def rate_limits(overview: records.LimitsOverview) -> _Json:
    """ListRateLimits's answer: the limits and what each holds back now."""
    return message_json(
        limits_pb2.ListRateLimitsResponse(
            limits=map(_rate_limit, overview.limits),
            rate_limits_waiting=map(_limit_waiting, overview.rate_limits_waiting),
            keys_waiting=map(_limit_waiting, overview.keys_waiting),
        )
    )


def _limit_waiting(held: records.LimitWaiting) -> limits_pb2.LimitWaiting:
    return limits_pb2.LimitWaiting(name=held.name, waiting=held.waiting)
