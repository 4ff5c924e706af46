"""The console's one way to awp-server: the public ControlService, over the async gRPC
stubs, answering in awp_console.models' values and failing with ApiError.

Nothing else in the console imports the generated messages or grpc, so that this module
alone changes when the console moves to another client library (the SDK's AsyncClient).
The channel is set up as every AWP client's (awp_common.tls); JSON values are read with
awp_protocol.jsonvalue (integers kept).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from awp.v1 import control_pb2, control_pb2_grpc, schedule_pb2, types_pb2
from awp_common import tls
from awp_console import models
from awp_console.settings import Settings
from awp_protocol.errors import decode_details
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.roles import Role

# A 5,000-task run's GetRun is a few MiB; gRPC's default cap is 4.
MAX_RECEIVE_BYTES: Final = 64 * 1024 * 1024

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class ApiError(Exception):
    """A call that failed: the gRPC code's name, the ErrorInfo reason, the message."""

    def __init__(self, code: str, message: str, reason: str = "") -> None:
        super().__init__(f"{reason or code}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class Unauthenticated(ApiError):
    """No credential, or one the server does not know."""


class PermissionDenied(ApiError):
    """A credential whose roles do not allow the call."""


class NotFound(ApiError):
    pass


class Unreachable(ApiError):
    """No answer from awp-server at all."""


_ERRORS: Final[dict[grpc.StatusCode, type[ApiError]]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unreachable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unreachable,
}


def _error(error: grpc.aio.AioRpcError, address: str, tls_on: bool) -> ApiError:
    details = decode_details(error.trailing_metadata())
    message = " ".join((error.details() or "").split())
    if details.violations:
        message = "; ".join(f"{field}: {problem}" for field, problem in details.violations)
    elif error.code() == grpc.StatusCode.UNAVAILABLE and not details.reason:
        why = tls.mismatch(message, tls_on) or message
        message = f"cannot reach awp-server at {address}: {why}"
    kind = _ERRORS.get(error.code(), ApiError)
    return kind(error.code().name, message, details.reason)


class Connection:
    """One channel to awp-server, shared by every browser session; create it inside the
    running event loop. `as_caller(token)` makes calls with one session's credential."""

    def __init__(self, settings: Settings) -> None:
        self.address = settings.address
        self._timeout = settings.timeout
        self._tls = tls.client_tls(settings)
        self._channel = tls.channel(
            settings.address, self._tls, [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        )
        self._stub = control_pb2_grpc.ControlServiceStub(self._channel)

    def as_caller(self, token: str) -> ControlApi:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return ControlApi(self, metadata)

    async def close(self) -> None:
        await self._channel.close()

    async def call(
        self,
        method: Callable[..., Awaitable[Resp]],
        request: Any,
        metadata: tuple[tuple[str, str], ...],
    ) -> Resp:
        try:
            return await method(request, metadata=metadata, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise _error(error, self.address, self._tls.on) from None

    def failure(self, error: grpc.aio.AioRpcError) -> ApiError:
        return _error(error, self.address, self._tls.on)


class ControlApi:
    """ControlService calls made with one credential (none: a server without them)."""

    def __init__(self, connection: Connection, metadata: tuple[tuple[str, str], ...]) -> None:
        self._connection = connection
        self._stub = connection._stub
        self._metadata = metadata

    async def _call(self, method: Callable[..., Awaitable[Resp]], request: Any) -> Resp:
        return await self._connection.call(method, request, self._metadata)

    async def who_am_i(self) -> models.Identity:
        answer = await self._call(self._stub.WhoAmI, control_pb2.WhoAmIRequest())
        known = {str(role) for role in Role}
        return models.Identity(
            answer.name,
            frozenset(Role(role) for role in answer.roles if role in known),
            answer.credentials_required,
        )

    # ------------------------------------------------------------ runs

    async def list_runs(
        self, *, workflow: str = "", state: str = "", page_token: str = "", page_size: int = 50
    ) -> models.Page[models.Run]:
        request = control_pb2.ListRunsRequest(
            workflow_name=workflow, page_token=page_token, page_size=page_size
        )
        if state:
            request.state = types_pb2.RunState.Value(f"RUN_STATE_{state.upper()}")
        answer = await self._call(self._stub.ListRuns, request)
        return models.Page(tuple(map(_run, answer.runs)), answer.next_page_token)

    async def get_run(self, run_id: str, *, outputs: bool = True) -> models.RunDetail:
        """The run, its tasks and attempts; outputs=False leaves every Task.output None
        (reading 5,000 outputs costs more than the page that needs none of them)."""
        answer = await self._call(self._stub.GetRun, control_pb2.GetRunRequest(run_id=run_id))
        return models.RunDetail(
            _run(answer.run),
            tuple(_task(task, outputs) for task in answer.tasks),
            tuple(map(_attempt, answer.attempts)),
            answer.tasks_omitted,
        )

    async def get_task(self, run_id: str, key: str) -> tuple[models.Run, models.Task | None]:
        """The run and one of its tasks (None: no such task), the others not read."""
        answer = await self._call(self._stub.GetRun, control_pb2.GetRunRequest(run_id=run_id))
        found = next((_task(t, True) for t in answer.tasks if t.key == key), None)
        return _run(answer.run), found

    async def list_attempts(
        self, run_id: str, *, task_key: str = "", page_token: str = ""
    ) -> models.Page[models.Attempt]:
        request = control_pb2.ListAttemptsRequest(
            run_id=run_id, task_key=task_key, page_token=page_token
        )
        answer = await self._call(self._stub.ListAttempts, request)
        return models.Page(tuple(map(_attempt, answer.attempts)), answer.next_page_token)

    async def cancel_run(self, run_id: str, reason: str = "") -> models.Run:
        request = control_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        return _run((await self._call(self._stub.CancelRun, request)).run)

    async def retry_run(
        self, run_id: str, *, from_task: str = "", request_id: str = ""
    ) -> models.Run:
        request = control_pb2.RetryRunRequest(
            run_id=run_id, from_task=from_task, request_id=request_id
        )
        return _run((await self._call(self._stub.RetryRun, request)).run)

    async def watch_run(self, run_id: str, after_seq: int = 0) -> AsyncIterator[models.Event]:
        """The run's events after after_seq, then live ones until the run has ended."""
        call = self._stub.WatchRun(
            control_pb2.WatchRunRequest(run_id=run_id, after_seq=after_seq),
            metadata=self._metadata,
        )
        try:
            async for answer in call:
                yield _event(answer.event)
        except grpc.aio.AioRpcError as error:
            raise self._connection.failure(error) from None
        finally:
            call.cancel()

    # ------------------------------------------------------------ workflows

    async def list_workflows(
        self, *, name: str = "", page_token: str = "", page_size: int = 100
    ) -> models.Page[models.Workflow]:
        request = control_pb2.ListWorkflowsRequest(
            name=name, page_token=page_token, page_size=page_size
        )
        answer = await self._call(self._stub.ListWorkflows, request)
        return models.Page(tuple(map(_workflow, answer.workflows)), answer.next_page_token)

    async def get_workflow(self, name: str, version: int = 0) -> models.Workflow:
        request = control_pb2.GetWorkflowRequest(name=name, version=version)
        return _workflow((await self._call(self._stub.GetWorkflow, request)).workflow)

    # ------------------------------------------------------------ fleet

    async def list_workers(self, *, include_inactive: bool = False) -> tuple[models.Worker, ...]:
        request = control_pb2.ListWorkersRequest(include_inactive=include_inactive)
        answer = await self._call(self._stub.ListWorkers, request)
        return tuple(map(_worker, answer.workers))

    async def list_schedules(self) -> tuple[models.Schedule, ...]:
        """Every schedule, by name (the server's pages followed)."""
        found: list[models.Schedule] = []
        request = schedule_pb2.ListSchedulesRequest()
        while True:
            answer = await self._call(self._stub.ListSchedules, request)
            found.extend(map(_schedule, answer.schedules))
            if not answer.next_page_token:
                return tuple(found)
            request.page_token = answer.next_page_token

    async def get_stats(self) -> models.Stats:
        answer = await self._call(self._stub.GetStats, control_pb2.GetStatsRequest())
        run_states, worker_states = types_pb2.RunState, types_pb2.WorkerState
        return models.Stats(
            tasks_by_state=tuple(
                models.KindCount(_name(types_pb2.TaskState, c.state), c.executor_kind, c.count)
                for c in answer.tasks_by_state
            ),
            dispatches_by_state=tuple(
                models.KindCount(_name(types_pb2.DispatchState, c.state), c.executor_kind, c.count)
                for c in answer.dispatches_by_state
            ),
            runs_by_state={_name(run_states, c.state): c.count for c in answer.runs_by_state},
            workers_by_state={
                _name(worker_states, c.state): c.count for c in answer.workers_by_state
            },
            active_leases=answer.active_leases,
            oldest_pending_s=(
                answer.oldest_pending.ToTimedelta().total_seconds()
                if answer.HasField("oldest_pending")
                else None
            ),
        )


# ---------------------------------------------------------------- messages -> models


class _Enum(Protocol):
    def Name(self, number: Any) -> str: ...


def _name(enum: _Enum, value: int) -> str:
    """TASK_STATE_WAITING_RETRY -> waiting_retry: the prefix is the enum's own values'."""
    try:
        full: str = enum.Name(value)
    except ValueError:
        return "unknown"
    prefix = enum.Name(0).removesuffix("UNSPECIFIED")
    return full.removeprefix(prefix).lower()


def _time(message: Any, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(message, field)
    # What ToDatetime does, a few times faster (a run has three stamps per task).
    return datetime.fromtimestamp(stamp.seconds, UTC).replace(microsecond=stamp.nanos // 1000)


def _json(message: Any, field: str) -> dict[str, Any] | None:
    if not message.HasField(field):
        return None
    value: struct_pb2.Struct = getattr(message, field)
    return struct_to_dict(value)


def _task_error(message: Any) -> models.TaskError | None:
    if not message.HasField("error"):
        return None
    error: types_pb2.TaskError = message.error
    return models.TaskError(
        error.message, error.retryable, error.type, error.traceback, error.log_tail
    )


def _run(run: control_pb2.Run) -> models.Run:
    return models.Run(
        id=run.id,
        workflow_name=run.workflow_name,
        workflow_version=run.workflow_version,
        state=_name(types_pb2.RunState, run.state),
        created_at=_time(run, "created_at"),
        finished_at=_time(run, "finished_at"),
        cancel_requested_at=_time(run, "cancel_requested_at"),
        last_seq=run.last_seq,
        tasks_by_state={_name(types_pb2.TaskState, c.state): c.count for c in run.tasks_by_state},
        input=_json(run, "input") or {},
        request_id=run.request_id,
        started_by=run.started_by,
        cancel_requested_by=run.cancel_requested_by,
        retried_from_run_id=run.retried_from_run_id,
        retry_from_task=run.retry_from_task,
    )


def _task(task: control_pb2.Task, outputs: bool) -> models.Task:
    return models.Task(
        key=task.key,
        state=_name(types_pb2.TaskState, task.state),
        executor_kind=task.executor_kind,
        action=task.action,
        depends_on=tuple(task.depends_on),
        attempts=task.attempts,
        max_attempts=task.max_attempts,
        output=_json(task, "output") if outputs else None,
        error=_task_error(task),
        retry_at=_time(task, "retry_at"),
        finished_at=_time(task, "finished_at"),
        reused_from_run_id=task.reused_from_run_id,
    )


def _attempt(attempt: control_pb2.Attempt) -> models.Attempt:
    return models.Attempt(
        task_key=attempt.task_key,
        attempt=attempt.attempt,
        state=_name(types_pb2.AttemptState, attempt.state),
        worker_id=attempt.worker_id,
        started_at=_time(attempt, "started_at"),
        deadline=_time(attempt, "deadline"),
        finished_at=_time(attempt, "finished_at"),
        error=_task_error(attempt),
        worker_name=attempt.worker_name,
    )


def _event(event: types_pb2.StateEvent) -> models.Event:
    transition = event.WhichOneof("transition")
    to_state = ""
    if transition == "run_transition":
        to_state = _name(types_pb2.RunState, event.run_transition.to_state)
    elif transition == "task_transition":
        to_state = _name(types_pb2.TaskState, event.task_transition.to_state)
    elif transition == "attempt_transition":
        to_state = _name(types_pb2.AttemptState, event.attempt_transition.to_state)
    return models.Event(
        seq=event.seq,
        type=_name(types_pb2.EventType, event.type),
        task_key=event.task_key,
        attempt=event.attempt,
        to_state=to_state,
    )


def _workflow(workflow: control_pb2.Workflow) -> models.Workflow:
    definition = workflow.definition
    shown = json_format.MessageToDict(definition, preserving_proto_field_name=True)
    tasks = []
    for task, task_shown in zip(definition.tasks, shown.get("tasks", []), strict=True):
        task_input = _json(task, "input") or {}
        if task.HasField("input"):
            task_shown["input"] = task_input  # protobuf JSON would make every number a float
        tasks.append(
            models.TaskDefinition(
                key=task.key,
                executor_kind=task.executor_kind,
                action=task.action,
                input=task_input,
                depends_on=tuple(task.depends_on),
                max_attempts=task.retry.max_attempts if task.HasField("retry") else 0,
                timeout_s=(
                    task.timeout.ToTimedelta().total_seconds() if task.HasField("timeout") else None
                ),
            )
        )
    return models.Workflow(
        name=definition.name,
        version=definition.version,
        description=definition.description,
        concurrency=definition.concurrency,
        tasks=tuple(tasks),
        created_at=_time(workflow, "created_at"),
        definition=shown,
    )


def _schedule(schedule: schedule_pb2.Schedule) -> models.Schedule:
    spec = schedule.spec
    if spec.cron:
        cadence = f"{spec.cron} ({spec.timezone})"
    else:
        cadence = f"every {spec.interval.ToTimedelta()}"
    return models.Schedule(
        name=spec.name,
        workflow=spec.workflow_name
        + (f"@{spec.workflow_version}" if spec.workflow_version else ""),
        cadence=cadence,
        overlap=_name(schedule_pb2.OverlapPolicy, spec.overlap),
        catchup=_name(schedule_pb2.CatchupPolicy, spec.catchup),
        paused=spec.paused,
        next_fire_at=_time(schedule, "next_fire_time"),
    )


def _worker(worker: control_pb2.WorkerInfo) -> models.Worker:
    return models.Worker(
        id=worker.id,
        name=worker.name,
        state=_name(types_pb2.WorkerState, worker.state),
        executor_kinds=tuple(worker.executor_kinds),
        max_concurrency=worker.max_concurrency,
        active_leases=worker.active_leases,
        labels=dict(worker.labels),
        protocol_version=worker.protocol_version,
        registered_at=_time(worker, "registered_at"),
        last_heartbeat_at=_time(worker, "last_heartbeat_at"),
    )
