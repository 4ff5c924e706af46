"""AsyncClient: the control API for application code, on asyncio.

    async with AsyncClient() as client:          # AWP_ADDRESS or 127.0.0.1:50051
        await client.apply(wf)
        run = await client.start(wf, input={"topic": "llamas"})
        outputs = await run.result(timeout=60)   # {"fetch": {...}, "summarize": {...}}

Every failure raises an awp_sdk.errors.AwpError subclass. The low-level door stays open:
``client.control`` is the generated stub and ``await client.call(method, request)`` calls
it with the token and deadline (what the `awp` CLI uses).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc

from awp.v1 import control_pb2, control_pb2_grpc, types_pb2
from awp_protocol.errors import FieldViolation, Reason
from awp_protocol.jsonvalue import JsonInvalid, to_struct
from awp_protocol.limits import MAX_PAGE_SIZE
from awp_sdk import definitions
from awp_sdk.connection import Channel, Connection
from awp_sdk.errors import InvalidArgument, RunCanceled, RunFailed, WaitTimeout
from awp_sdk.records import Event, Run, RunDetail, TaskStatus
from awp_sdk.streams import StreamItem, task_stream
from awp_sdk.watch import GIVE_UP_AFTER_S, ReconnectHandler, run_events
from awp_sdk.workflow import Workflow

Req = TypeVar("Req")
Resp = TypeVar("Resp")

# What apply() takes: a Workflow in code, a workflow file's data (parsed YAML or JSON), or
# the definition message itself.
WorkflowLike = Workflow | Mapping[str, Any] | types_pb2.WorkflowDefinition


@dataclass(frozen=True)
class Applied:
    """What CreateWorkflow answered: created False when the identical definition existed."""

    name: str
    version: int
    created: bool


def definition_of(workflow: WorkflowLike) -> types_pb2.WorkflowDefinition:
    """The definition to send, checked with the server's rules first (DefinitionInvalid)."""
    if isinstance(workflow, Workflow):
        return workflow.definition()
    if isinstance(workflow, types_pb2.WorkflowDefinition):
        return definitions.validate(workflow)
    return definitions.validate(definitions.definition(workflow))


def json_input(value: Mapping[str, Any] | None, where: str) -> Any:
    """A JSON object as a Struct, or InvalidArgument naming what cannot be sent exactly."""
    if value is None:
        return None
    try:
        return to_struct(value, where)
    except JsonInvalid as exc:
        raise InvalidArgument(
            str(exc),
            reason=Reason.INVALID_ARGUMENT,
            violations=[FieldViolation(exc.where or where, exc.problem)],
        ) from None


class AsyncClient:
    """A connection to awp-server. Options left None come from the AWP_* environment
    (AWP_ADDRESS, AWP_TOKEN or AWP_TOKEN_FILE, AWP_TLS_*, AWP_TIMEOUT), as for `awp`."""

    def __init__(
        self,
        address: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_server_name: str | None = None,
        timeout: float | None = None,
        connection: Connection | None = None,
    ) -> None:
        self.connection = connection or Connection.from_env(
            address=address,
            token=token,
            token_file=token_file,
            tls=tls,
            tls_ca_file=tls_ca_file,
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            tls_server_name=tls_server_name,
            timeout=timeout,
        )
        self._channel: Channel | None = None

    # ------------------------------------------------------------ the channel

    @property
    def channel(self) -> Channel:
        # Made on first use: gRPC wants its channel created inside the running loop.
        if self._channel is None:
            self._channel = Channel(self.connection)
        return self._channel

    @property
    def control(self) -> control_pb2_grpc.ControlServiceAsyncStub:
        return self.channel.control

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Req) -> Resp:
        return await self.channel.call(method, request)

    def stream(
        self, method: Callable[..., grpc.aio.UnaryStreamCall[Req, Resp]], request: Req
    ) -> grpc.aio.UnaryStreamCall[Req, Resp]:
        return self.channel.stream(method, request)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ workflows

    async def apply(self, workflow: WorkflowLike) -> Applied:
        """Stores the workflow version; the identical definition again is a no-op."""
        answer = await self.call(
            self.control.CreateWorkflow,
            control_pb2.CreateWorkflowRequest(definition=definition_of(workflow)),
        )
        stored = answer.workflow.definition
        return Applied(stored.name, stored.version, answer.created)

    # ------------------------------------------------------------ runs

    async def start(
        self,
        workflow: Workflow | str,
        input: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        version: int | None = None,
    ) -> AsyncRunHandle:
        """Starts a run of a workflow (a Workflow, or a name: the latest version unless
        `version` is given). The same request_id again returns the same run."""
        if isinstance(workflow, Workflow):
            name, default_version = workflow.name, workflow.version
        else:
            name, default_version = workflow, 0
        request = control_pb2.StartRunRequest(
            workflow_name=name,
            workflow_version=default_version if version is None else version,
            input=json_input(input, "input"),
            request_id=request_id or "",
        )
        answer = await self.call(self.control.StartRun, request)
        return AsyncRunHandle(self, answer.run.id, Run.from_proto(answer.run), answer.created)

    async def retry(
        self, run_id: str, *, from_task: str | None = None, request_id: str | None = None
    ) -> AsyncRunHandle:
        """Starts a new run of a finished run's workflow version and input that reuses the
        outputs of the tasks that succeeded and runs only the rest (from_task: that task and
        everything downstream of it too). RunNotFinished while the run still runs."""
        answer = await self.call(
            self.control.RetryRun,
            control_pb2.RetryRunRequest(
                run_id=run_id, from_task=from_task or "", request_id=request_id or ""
            ),
        )
        return AsyncRunHandle(self, answer.run.id, Run.from_proto(answer.run), answer.created)

    def run(self, run_id: str) -> AsyncRunHandle:
        """A handle on a run started elsewhere."""
        return AsyncRunHandle(self, run_id)

    async def get_run(self, run_id: str) -> RunDetail:
        answer = await self.call(self.control.GetRun, control_pb2.GetRunRequest(run_id=run_id))
        return RunDetail.from_proto(answer)

    async def list_tasks(self, run_id: str) -> AsyncIterator[TaskStatus]:
        """Every task of the run, map elements included, in get_run's order, a page at a
        time (get_run lists the first 10,000)."""
        request = control_pb2.ListTasksRequest(run_id=run_id)
        while True:
            answer = await self.call(self.control.ListTasks, request)
            for task in answer.tasks:
                yield TaskStatus.from_proto(task)
            if not answer.next_page_token:
                return
            request.page_token = answer.next_page_token

    async def list_runs(
        self, *, workflow: str | None = None, state: str | None = None, page_size: int = 100
    ) -> AsyncIterator[Run]:
        """Every run (of a workflow, in a state), newest first, a page at a time."""
        request = control_pb2.ListRunsRequest(
            workflow_name=workflow or "", page_size=min(page_size, MAX_PAGE_SIZE)
        )
        if state:
            request.state = types_pb2.RunState.Value(f"RUN_STATE_{state.upper()}")
        while True:
            answer = await self.call(self.control.ListRuns, request)
            for run in answer.runs:
                yield Run.from_proto(run)
            if not answer.next_page_token:
                return
            request.page_token = answer.next_page_token

    async def cancel(self, run_id: str, reason: str | None = None) -> Run:
        """Asks for the run's cancellation (the coordinator converges it)."""
        answer = await self.call(
            self.control.CancelRun, control_pb2.CancelRunRequest(run_id=run_id, reason=reason or "")
        )
        return Run.from_proto(answer.run)

    async def watch(
        self,
        run_id: str,
        *,
        after_seq: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
        on_reconnect: ReconnectHandler | None = None,
    ) -> AsyncIterator[Event]:
        """The run's events after `after_seq` until it ends, resumed across reconnects."""
        async for event in run_events(
            self.channel,
            run_id,
            after_seq=after_seq,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        ):
            yield Event.from_proto(event)

    async def task_stream(
        self,
        run_id: str,
        task_key: str,
        *,
        from_offset: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
        on_reconnect: ReconnectHandler | None = None,
    ) -> AsyncIterator[StreamItem]:
        """The task's output stream from position `from_offset` until the task ends:
        StreamChunk and AttemptBoundary records, resumed across reconnects."""
        async for item in task_stream(
            self.channel,
            run_id,
            task_key,
            from_offset=from_offset,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        ):
            yield item


class AsyncRunHandle:
    """One run: its id, and how to wait for it, watch it or cancel it."""

    def __init__(
        self, client: AsyncClient, run_id: str, run: Run | None = None, created: bool = True
    ) -> None:
        self.client = client
        self.id = run_id
        # The run as StartRun answered (None for a handle made from an id).
        self.started = run
        # False when the request id had already started this run.
        self.created = created

    def __repr__(self) -> str:
        return f"<AsyncRunHandle {self.id}>"

    async def get(self) -> RunDetail:
        return await self.client.get_run(self.id)

    # The same signature as RunHandle.result: one API, sync or async.
    async def result(self, timeout: float | None = None) -> dict[str, dict[str, Any]]:  # noqa: ASYNC109
        """Waits for the run to end; returns each succeeded task's output by task key.

        Raises RunFailed (with the failed task, its error and traceback), RunCanceled, or
        WaitTimeout once `timeout` seconds pass (the run goes on).
        """
        try:
            async with asyncio.timeout(timeout):
                detail = await self.get()
                if not detail.run.done:
                    async for _ in self.watch(after_seq=detail.run.last_seq):
                        pass
                    detail = await self.get()
        except TimeoutError:
            raise WaitTimeout(f"run {self.id} did not end within {timeout:g} s") from None
        return outcome(detail)

    async def watch(self, *, after_seq: int = 0) -> AsyncIterator[Event]:
        async for event in self.client.watch(self.id, after_seq=after_seq):
            yield event

    async def stream(self, task_key: str, *, from_offset: int = 0) -> AsyncIterator[StreamItem]:
        async for item in self.client.task_stream(self.id, task_key, from_offset=from_offset):
            yield item

    async def cancel(self, reason: str | None = None) -> Run:
        return await self.client.cancel(self.id, reason)


def outcome(detail: RunDetail) -> dict[str, dict[str, Any]]:
    """The outputs of a succeeded run; RunFailed or RunCanceled otherwise."""
    run = detail.run
    if run.state == "canceled":
        raise RunCanceled(f"run {run.id} was canceled", run_id=run.id)
    if run.state != "failed":
        return detail.outputs()
    failed = first_failure(detail.tasks.values())
    if failed is None:
        raise RunFailed(
            f"run {run.id} failed",
            run_id=run.id,
            task_key=None,
            error=None,
            attempt=None,
            retryable=None,
        )
    error = failed.error
    message = error.message if error is not None else "no error recorded"
    plural = "attempt" if failed.attempts == 1 else "attempts"
    raise RunFailed(
        f"run {run.id} failed: task {failed.key!r} failed after {failed.attempts} "
        f"{plural}: {message}",
        run_id=run.id,
        task_key=failed.key,
        error=error.message if error is not None else None,
        attempt=failed.attempts or None,
        retryable=error.retryable if error is not None else None,
        error_type=error.type if error is not None else None,
        traceback=error.traceback if error is not None else None,
        log_tail=error.log_tail if error is not None else None,
    )


def first_failure(tasks: Iterable[TaskStatus]) -> TaskStatus | None:
    """The failed task that ended the run: the first to finish failing."""
    failed = [t for t in tasks if t.state == "failed"]
    if not failed:
        return None
    latest = datetime.max.replace(tzinfo=UTC)
    return min(failed, key=lambda t: t.finished_at or latest)
