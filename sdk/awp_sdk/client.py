"""AsyncClient: the control API for application code, on asyncio — one method for every
ControlService call, each answering with awp_sdk.records values.

    async with AsyncClient() as client:          # AWP_ADDRESS or 127.0.0.1:50051
        await client.apply(wf)
        run = await client.start(wf, input={"topic": "llamas"})
        outputs = await run.result(timeout=60)   # {"fetch": {...}, "summarize": {...}}

Every failure raises an awp_sdk.errors.AwpError subclass. A List call has two forms:
``list_runs`` yields every item, page after page; ``list_runs_page`` answers one page
and its next_page_token (for a client that pages as its user does). The low-level door
stays open: ``client.control`` is the generated stub and ``await client.call(method,
request)`` calls it with the token and deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_common.durations import parse_duration
from awp_protocol.jsonvalue import parse_object
from awp_protocol.limits import MAX_PAGE_SIZE
from awp_sdk import decode, definitions, resumes
from awp_sdk.connection import Channel, Connection
from awp_sdk.enums import RunState, encode
from awp_sdk.handle import AsyncRunHandle, complete_outputs
from awp_sdk.records import (
    Applied,
    Attempt,
    Decided,
    Event,
    Identity,
    Page,
    Pruned,
    Run,
    RunDecision,
    RunDetail,
    SignalSent,
    Stats,
    StoredWorkflow,
    TaskPage,
    TaskStatus,
    Worker,
)
from awp_sdk.starts import RunRequest
from awp_sdk.streams import StreamItem, task_stream
from awp_sdk.watch import GIVE_UP_AFTER_S, ReconnectHandler, run_events
from awp_sdk.workflow import Duration, Workflow

Req = TypeVar("Req")
Resp = TypeVar("Resp")
T = TypeVar("T")

# What apply() takes: a Workflow in code, a workflow file's data (parsed YAML or JSON), or
# the definition message itself.
WorkflowLike = Workflow | Mapping[str, Any] | types_pb2.WorkflowDefinition


def definition_of(workflow: WorkflowLike) -> types_pb2.WorkflowDefinition:
    """The definition to send, checked with the server's rules first (DefinitionInvalid)."""
    if isinstance(workflow, Workflow):
        return workflow.definition()
    if isinstance(workflow, types_pb2.WorkflowDefinition):
        return definitions.validate(workflow)
    return definitions.validate(definitions.definition(workflow))


async def every_item(page: Callable[[str], Awaitable[Page[T]]]) -> AsyncIterator[T]:
    """Every item of a List call, following its page tokens to the last page."""
    token = ""
    while True:
        answer = await page(token)
        for item in answer.items:
            yield item
        if not answer.next_page_token:
            return
        token = answer.next_page_token


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

    def as_caller(self, token: str) -> AsyncClient:
        """A client sharing this one's channel that calls with another token: one
        connection for many callers (the web console's sessions). Closing it leaves the
        channel open; closing this client closes it for both."""
        caller = AsyncClient(connection=dataclasses.replace(self.connection, token=token))
        caller._channel = self.channel.as_caller(caller.connection)
        return caller

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
        """Stores the workflow version (CreateWorkflow); the identical definition again is
        a no-op (created False)."""
        answer = await self.call(
            self.control.CreateWorkflow,
            control_pb2.CreateWorkflowRequest(definition=definition_of(workflow)),
        )
        return decode.applied(answer)

    async def get_workflow(self, name: str, version: int = 0) -> StoredWorkflow:
        """A stored workflow version (0: the latest)."""
        request = control_pb2.GetWorkflowRequest(name=name, version=version)
        return decode.workflow((await self.call(self.control.GetWorkflow, request)).workflow)

    async def list_workflows_page(
        self, *, name: str | None = None, page_size: int = 100, page_token: str = ""
    ) -> Page[StoredWorkflow]:
        request = control_pb2.ListWorkflowsRequest(
            name=name or "", page_size=min(page_size, MAX_PAGE_SIZE), page_token=page_token
        )
        answer = await self.call(self.control.ListWorkflows, request)
        return Page(tuple(map(decode.workflow, answer.workflows)), answer.next_page_token)

    def list_workflows(self, *, name: str | None = None) -> AsyncIterator[StoredWorkflow]:
        """Every stored workflow version (of one name), a page at a time."""
        return every_item(lambda token: self.list_workflows_page(name=name, page_token=token))

    # ------------------------------------------------------------ runs

    async def start(
        self,
        workflow: Workflow | str,
        input: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        version: int | None = None,
        start_at: datetime | None = None,
        start_in: timedelta | None = None,
        priority: int = 0,
    ) -> AsyncRunHandle:
        """Starts a run (see RunRequest for what each argument asks)."""
        request = RunRequest(
            workflow, input, request_id, version, start_at, start_in, priority
        ).message()
        answer = await self.call(self.control.StartRun, request)
        return AsyncRunHandle(self, answer.run.id, decode.run(answer.run), answer.created)

    async def start_many(self, requests: Iterable[RunRequest]) -> list[AsyncRunHandle]:
        """Starts many runs in one call and one transaction (StartRuns: at most 1,000),
        all or none: an entry StartRun would refuse refuses the batch, its error naming
        the entry (runs[i]). One handle per request, in order; `created` is False for a
        request_id that had started its run before."""
        batch = runs_pb2.StartRunsRequest(
            runs=[request.message(f"runs[{i}].input") for i, request in enumerate(requests)]
        )
        answer = await self.call(self.control.StartRuns, batch)
        return [AsyncRunHandle(self, run.run_id, None, run.created) for run in answer.runs]

    async def retry(
        self, run_id: str, *, from_task: str | None = None, request_id: str | None = None
    ) -> AsyncRunHandle:
        """Starts a new run of a finished run's workflow version and input that reuses the
        outputs of the tasks that succeeded and runs only the rest (from_task: that task and
        everything downstream of it too). RunNotFinished while the run still runs."""
        answer = await self.call(
            self.control.RetryRun,
            runs_pb2.RetryRunRequest(
                run_id=run_id, from_task=from_task or "", request_id=request_id or ""
            ),
        )
        return AsyncRunHandle(self, answer.run.id, decode.run(answer.run), answer.created)

    def run(self, run_id: str) -> AsyncRunHandle:
        """A handle on a run started elsewhere."""
        return AsyncRunHandle(self, run_id)

    async def get_run(self, run_id: str, *, outputs: bool = True) -> RunDetail:
        """The run, its tasks and attempts (GetRun). With outputs (the default) the record
        holds every output, whatever its size: the ones GetRun left out are fetched with
        GetTaskOutput, and a run past GetRun's 10,000 tasks is read whole with ListTasks.
        outputs=False makes the one GetRun call (a view that shows no large output): what
        it left out stays flagged (TaskStatus.output_omitted, tasks_omitted), and
        RunDetail.outputs() raises OutputsOmitted rather than answer without them."""
        answer = await self.call(self.control.GetRun, runs_pb2.GetRunRequest(run_id=run_id))
        detail = decode.run_detail(answer)
        return await complete_outputs(self, detail) if outputs else detail

    async def get_task_output(self, run_id: str, task_key: str) -> dict[str, Any] | None:
        """One task's output, however large (at most 1 MiB); None when it has none (yet)."""
        request = runs_pb2.GetTaskOutputRequest(run_id=run_id, task_key=task_key)
        answer = await self.call(self.control.GetTaskOutput, request)
        return parse_object(answer.output_json) if answer.output_json else None

    async def list_tasks_page(
        self, run_id: str, *, page_size: int = MAX_PAGE_SIZE, page_token: str = ""
    ) -> TaskPage:
        """A page of the run's tasks in get_run's order; outputs past the page's budget
        are left out (TaskStatus.output_omitted)."""
        request = runs_pb2.ListTasksRequest(
            run_id=run_id, page_size=min(page_size, MAX_PAGE_SIZE), page_token=page_token
        )
        return decode.task_page(await self.call(self.control.ListTasks, request))

    def list_tasks(self, run_id: str) -> AsyncIterator[TaskStatus]:
        """Every task of the run, map elements included, in get_run's order, a page at a
        time (get_run lists the first 10,000)."""
        return every_item(lambda token: self.list_tasks_page(run_id, page_token=token))

    async def list_attempts_page(
        self, run_id: str, *, task_key: str | None = None, page_token: str = ""
    ) -> Page[Attempt]:
        """A page (at most 25) of the run's attempts, or one task's, oldest first, each
        with its whole failure: type, message, traceback and log tail."""
        request = runs_pb2.ListAttemptsRequest(
            run_id=run_id, task_key=task_key or "", page_token=page_token
        )
        answer = await self.call(self.control.ListAttempts, request)
        return Page(tuple(map(decode.attempt, answer.attempts)), answer.next_page_token)

    def list_attempts(self, run_id: str, *, task_key: str | None = None) -> AsyncIterator[Attempt]:
        """Every attempt of the run (or of one task), oldest first, a page at a time."""
        return every_item(
            lambda token: self.list_attempts_page(run_id, task_key=task_key, page_token=token)
        )

    async def list_runs_page(
        self,
        *,
        workflow: str | None = None,
        state: RunState | str | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> Page[Run]:
        request = runs_pb2.ListRunsRequest(
            workflow_name=workflow or "",
            page_size=min(page_size, MAX_PAGE_SIZE),
            page_token=page_token,
        )
        if state:
            request.state = encode(RunState, state)  # type: ignore[assignment]
        answer = await self.call(self.control.ListRuns, request)
        return Page(tuple(map(decode.run, answer.runs)), answer.next_page_token)

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        state: RunState | str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Run]:
        """Every run (of a workflow, in a state), newest first, a page at a time."""
        return every_item(
            lambda token: self.list_runs_page(
                workflow=workflow, state=state, page_size=page_size, page_token=token
            )
        )

    async def cancel(self, run_id: str, reason: str | None = None) -> Run:
        """Asks for the run's cancellation (the coordinator converges it)."""
        answer = await self.call(
            self.control.CancelRun, runs_pb2.CancelRunRequest(run_id=run_id, reason=reason or "")
        )
        return decode.run(answer.run)

    async def watch(
        self,
        run_id: str,
        *,
        after_seq: int = 0,
        give_up_after: float = GIVE_UP_AFTER_S,
        on_reconnect: ReconnectHandler | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The run's events after `after_seq` until it ends, resumed across reconnects
        (aclose() it to stop early)."""
        async for event in run_events(
            self.channel,
            run_id,
            after_seq=after_seq,
            give_up_after=give_up_after,
            on_reconnect=on_reconnect,
        ):
            yield decode.event(event)

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

    async def prune_runs(
        self,
        older_than: Duration,
        *,
        dry_run: bool = False,
        limit: int = 0,
        page_token: str = "",
    ) -> Pruned:
        """One PruneRuns call: deletes (dry_run: counts) at most `limit` finished runs
        (0: the server's default) that ended more than older_than ago. Call again while
        Pruned.remaining is above 0 (dry run: with its next_page_token)."""
        seconds = (
            older_than.total_seconds()
            if isinstance(older_than, timedelta)
            else parse_duration(older_than)
        )
        request = control_pb2.PruneRunsRequest(dry_run=dry_run, limit=limit, page_token=page_token)
        request.older_than.FromTimedelta(timedelta(seconds=seconds))
        return decode.pruned(await self.call(self.control.PruneRuns, request))

    # ------------------------------------------------------------ durable waits

    async def send_signal(
        self, run_id: str, name: str, payload: Any = None, *, request_id: str | None = None
    ) -> SignalSent:
        """Sends the run a signal (any JSON value as payload): stored at once, consumed by
        the oldest task waiting for its name, else buffered until a wait reaches it. The
        same request_id again sends nothing (duplicate). RunFinished once the run ended."""
        request = resumes.signal_request(run_id, name, payload, request_id)
        return decode.signal_sent(await self.call(self.control.SendSignal, request))

    async def decisions(self, run_id: str, *, task_key: str | None = None) -> list[RunDecision]:
        """The decisions made on the run's approvals (or one task's), oldest first, as its
        events record them up to now: who decided, the comment, the attempt resumed."""
        return await resumes.decisions(self, run_id, task_key)

    async def approve(self, run_id: str, task_key: str, comment: str = "") -> Decided:
        """Approves what the WAITING task asks (approver or admin role); NotWaiting when it
        waits for no approval."""
        request = resumes.decision(run_id, task_key, comment, approve=True)
        return decode.decided(await self.call(self.control.Approve, request))

    async def reject(self, run_id: str, task_key: str, comment: str = "") -> Decided:
        """Rejects what the WAITING task asks; see approve."""
        request = resumes.decision(run_id, task_key, comment, approve=False)
        return decode.decided(await self.call(self.control.Reject, request))

    # ------------------------------------------------------------ fleet

    async def list_workers(self, *, include_inactive: bool = False) -> tuple[Worker, ...]:
        """Active and draining worker sessions (include_inactive: stopped and offline ones
        too, newest first, at most 1,000)."""
        request = control_pb2.ListWorkersRequest(include_inactive=include_inactive)
        answer = await self.call(self.control.ListWorkers, request)
        return tuple(map(decode.worker, answer.workers))

    async def get_stats(self) -> Stats:
        return decode.stats(await self.call(self.control.GetStats, control_pb2.GetStatsRequest()))

    async def who_am_i(self) -> Identity:
        """The caller's credential name and roles."""
        answer = await self.call(self.control.WhoAmI, control_pb2.WhoAmIRequest())
        return decode.identity(answer)
