"""A scriptable in-memory WorkerService on a real grpc.aio server, for runtime tests.

It follows the protocol's rules (fencing by lease token, DUPLICATE / RESULT_CONFLICT /
LEASE_LOST, drain -> stopped once no lease remains, hand-back, the server's check of each
result) without a database, and lets a test inject faults: errors before or after a call
is processed, revocations, broken heartbeat streams, leases that are never renewed.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from awp.v1 import session_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from awp_protocol.errors import STATUS_DETAILS_KEY, FieldsInvalid, Reason, encode_status
from awp_protocol.results import check_result
from kit.proto import seconds, struct

TOKEN = "fake-worker-token"


@dataclass(frozen=True)
class Fault:
    """An error a call answers with; ``after=True``: the call is processed first and
    only its answer is lost."""

    code: grpc.StatusCode
    reason: str = ""
    message: str = "injected"
    after: bool = False
    hang: bool = False  # never answer (until the client gives up)


async def abort(context: grpc.aio.ServicerContext[Any, Any], fault: Fault) -> None:
    if fault.hang:
        await asyncio.Event().wait()
    metadata: tuple[tuple[str, str | bytes], ...] = ()
    if fault.reason:
        status = encode_status(fault.code.value[0], fault.message, Reason(fault.reason))
        metadata = ((STATUS_DETAILS_KEY, status.SerializeToString()),)
    await context.abort(fault.code, fault.message, trailing_metadata=metadata)


@dataclass
class Task:
    dispatch_id: int
    action: str
    input: dict[str, Any]
    kind: str = "mock"
    attempt: int = 1
    max_attempts: int = 3
    lease_s: float = 15.0
    attempt_s: float = 60.0
    # What heartbeats answer for it: "renew" (RENEWED), "silent" (RENEWED without
    # extending: the lease runs out), or set by revoke().
    renew: str = "renew"
    token: str = ""
    holder: str = ""
    state: str = "pending"  # (parked,) pending, leased, completed, revoked, handed_back
    result: worker_pb2.TaskResult | None = None
    # The run's span (Lease.traceparent); empty: the run is not traced.
    traceparent: str = ""


@dataclass
class FakeWorkerService(worker_pb2_grpc.WorkerServiceServicer):
    heartbeat_interval: float = 0.2
    lease_ttl: float = 15.0
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    tasks: dict[int, Task] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)  # worker_id -> state
    session_tokens: dict[str, str] = field(default_factory=dict)
    register_metadata: list[dict[str, str]] = field(default_factory=list)
    claims: list[worker_pb2.ClaimRequest] = field(default_factory=list)
    heartbeats: list[worker_pb2.HeartbeatRequest] = field(default_factory=list)
    completes: list[worker_pb2.CompleteRequest] = field(default_factory=list)
    drains: list[worker_pb2.DrainRequest] = field(default_factory=list)
    streams_opened: int = 0
    # Next heartbeat answers carry this session state instead of the real one.
    forced_session_state: types_pb2.WorkerState.ValueType | None = None
    last_register: worker_pb2.RegisterRequest | None = None

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._work = asyncio.Condition()
        self._break_streams = asyncio.Event()
        self._changed = asyncio.Event()
        # Answers the server sends unprompted (push()), as awp-server pushes REVOKED.
        self._pushes: asyncio.Queue[worker_pb2.HeartbeatResponse] = asyncio.Queue()

    # --- scripting ----------------------------------------------------------------------

    async def add(
        self, action: str = "noop", input: dict[str, Any] | None = None, **kw: Any
    ) -> Task:
        task = Task(next(self._ids), action, input or {}, **kw)
        self.tasks[task.dispatch_id] = task
        async with self._work:
            self._work.notify_all()
        return task

    def fail(self, method: str, *faults: Fault) -> None:
        self.faults.setdefault(method, []).extend(faults)

    def revoke(self, task: Task) -> None:
        task.state = "revoked"

    async def offer(self, task: Task) -> None:
        """Makes a task added with state="parked" claimable."""
        task.state = "pending"
        async with self._work:
            self._work.notify_all()

    def push_revoked(self, dispatch_id: int) -> None:
        """Says REVOKED for dispatch_id on the open stream now, not at a heartbeat."""
        self._pushes.put_nowait(
            worker_pb2.HeartbeatResponse(
                session_state=types_pb2.WORKER_STATE_ACTIVE,
                leases=[
                    worker_pb2.LeaseState(
                        dispatch_id=dispatch_id, status=worker_pb2.LEASE_STATUS_REVOKED
                    )
                ],
            )
        )

    def break_streams(self) -> None:
        self._break_streams.set()

    def results(self) -> dict[int, worker_pb2.TaskResult]:
        return {t.dispatch_id: t.result for t in self.tasks.values() if t.result is not None}

    def leased(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.state == "leased"]

    def _fault(self, method: str, *, after: bool) -> Fault | None:
        queue = self.faults.get(method) or []
        if queue and queue[0].after == after:
            return queue.pop(0)
        return None

    def _check_session(self, session: session_pb2.Session) -> str | None:
        if self.session_tokens.get(session.worker_id) != session.session_token:
            return None
        state = self.sessions.get(session.worker_id)
        return state if state in ("active", "draining") else None

    # --- service ------------------------------------------------------------------------

    async def Register(
        self, request: worker_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.RegisterResponse:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        self.register_metadata.append(metadata)
        fault = self._fault("Register", after=False)
        if fault:
            await abort(context, fault)
        if metadata.get("authorization") != f"Bearer {TOKEN}":
            await abort(
                context, Fault(grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID", "bad token")
            )
        if request.protocol_version != 1:
            await abort(
                context,
                Fault(grpc.StatusCode.FAILED_PRECONDITION, "PROTOCOL_UNSUPPORTED", "protocol"),
            )
        worker_id = f"w-{len(self.sessions) + 1}"
        session_token = secrets.token_hex(8)
        self.sessions[worker_id] = "active"
        self.session_tokens[worker_id] = session_token
        self.last_register = request
        return worker_pb2.RegisterResponse(
            session=session_pb2.Session(worker_id=worker_id, session_token=session_token),
            heartbeat_interval=seconds(self.heartbeat_interval),
            lease_ttl=seconds(self.lease_ttl),
            stream_grace=seconds(1.0),
        )

    async def Claim(
        self, request: worker_pb2.ClaimRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.ClaimResponse:
        self.claims.append(request)
        fault = self._fault("Claim", after=False)
        if fault:
            await abort(context, fault)
        state = self._check_session(request.session)
        if state is None:
            await abort(context, Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
        if state == "draining":
            await abort(context, Fault(grpc.StatusCode.FAILED_PRECONDITION, "WORKER_DRAINING"))
        wait = request.wait.ToNanoseconds() / 1e9
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        async with self._work:
            while True:
                pending = [t for t in self.tasks.values() if t.state == "pending"]
                if pending or loop.time() >= deadline:
                    break
                try:
                    async with asyncio.timeout(deadline - loop.time()):
                        await self._work.wait()
                except TimeoutError:
                    break
        # Like the real server: a parked claim re-checks the session when it wakes.
        state = self._check_session(request.session)
        if state is None:
            await abort(context, Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
        if state == "draining":
            await abort(context, Fault(grpc.StatusCode.FAILED_PRECONDITION, "WORKER_DRAINING"))
        issued = []
        for task in pending[: request.max_leases]:
            task.state = "leased"
            task.token = secrets.token_hex(8)
            task.holder = request.session.worker_id
            issued.append(
                worker_pb2.Lease(
                    dispatch_id=task.dispatch_id,
                    lease_token=task.token,
                    fencing_token=1000 + task.dispatch_id,
                    run_id="run-1",
                    task_key=f"t{task.dispatch_id}",
                    executor_kind=task.kind,
                    action=task.action,
                    input=struct(task.input),
                    attempt=task.attempt,
                    max_attempts=task.max_attempts,
                    idempotency_key=f"run-1/t{task.dispatch_id}",
                    lease_remaining=seconds(min(task.lease_s, task.attempt_s)),
                    attempt_remaining=seconds(task.attempt_s),
                    traceparent=task.traceparent,
                )
            )
        return worker_pb2.ClaimResponse(leases=issued)

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[worker_pb2.HeartbeatRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.HeartbeatResponse]:
        self.streams_opened += 1
        self._break_streams.clear()
        requests = aiter(request_iterator)
        next_request: asyncio.Future[worker_pb2.HeartbeatRequest | None] | None = None
        while True:
            if next_request is None:
                next_request = asyncio.ensure_future(anext(requests, None))
            breaker = asyncio.ensure_future(self._break_streams.wait())
            pushed = asyncio.ensure_future(self._pushes.get())
            done, _ = await asyncio.wait(
                {next_request, breaker, pushed}, return_when=asyncio.FIRST_COMPLETED
            )
            breaker.cancel()
            if pushed in done:
                yield pushed.result()
                continue
            pushed.cancel()
            if next_request not in done:
                next_request.cancel()
                await abort(context, Fault(grpc.StatusCode.UNAVAILABLE, message="stream broken"))
            request = next_request.result()
            next_request = None
            if request is None:
                return
            self.heartbeats.append(request)
            fault = self._fault("Heartbeat", after=False)
            if fault:
                await abort(context, fault)
            state = self.sessions.get(request.session.worker_id, "offline")
            answers = []
            for ref in request.leases:
                task = self.tasks.get(ref.dispatch_id)
                if task is None or task.token != ref.lease_token:
                    status = worker_pb2.LEASE_STATUS_UNKNOWN
                elif task.state == "revoked":
                    status = worker_pb2.LEASE_STATUS_REVOKED
                elif task.state in ("leased", "completed"):
                    status = worker_pb2.LEASE_STATUS_RENEWED
                else:
                    status = worker_pb2.LEASE_STATUS_UNKNOWN
                answer = worker_pb2.LeaseState(dispatch_id=ref.dispatch_id, status=status)
                if status == worker_pb2.LEASE_STATUS_RENEWED and task is not None:
                    if task.renew == "renew":
                        answer.lease_remaining.CopyFrom(seconds(task.lease_s))
                        answer.attempt_remaining.CopyFrom(seconds(task.attempt_s))
                    else:  # "silent": answers without extending (e.g. a tiny remaining)
                        answer.lease_remaining.CopyFrom(seconds(0.0))
                answers.append(answer)
            session_state = {
                "active": types_pb2.WORKER_STATE_ACTIVE,
                "draining": types_pb2.WORKER_STATE_DRAINING,
                "stopped": types_pb2.WORKER_STATE_STOPPED,
                "offline": types_pb2.WORKER_STATE_OFFLINE,
            }[state]
            if self.forced_session_state is not None:
                session_state = self.forced_session_state
            yield worker_pb2.HeartbeatResponse(session_state=session_state, leases=answers)

    async def Complete(
        self, request: worker_pb2.CompleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.CompleteResponse:
        self.completes.append(request)
        fault = self._fault("Complete", after=False)
        if fault:
            await abort(context, fault)
        if self._check_session(request.session) is None:
            await abort(context, Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
        try:
            # The real server's own check: what it refuses, refused alike.
            for index, result in enumerate(request.results):
                check_result(f"results[{index}]", result)
        except FieldsInvalid as exc:
            status = encode_status(
                grpc.StatusCode.INVALID_ARGUMENT.value[0],
                str(exc),
                Reason.INVALID_ARGUMENT,
                violations=exc.violations,
            )
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                str(exc),
                trailing_metadata=((STATUS_DETAILS_KEY, status.SerializeToString()),),
            )
        answers = []
        for result in request.results:
            task = self.tasks.get(result.dispatch_id)
            if task is None or task.token != result.lease_token:
                outcome = session_pb2.COMPLETE_OUTCOME_LEASE_LOST
            elif task.state == "completed":
                outcome = (
                    session_pb2.COMPLETE_OUTCOME_DUPLICATE
                    if task.result == result
                    else session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT
                )
            elif task.state != "leased":
                outcome = session_pb2.COMPLETE_OUTCOME_LEASE_LOST
            else:
                task.state = "completed"
                task.result = result
                outcome = session_pb2.COMPLETE_OUTCOME_ACCEPTED
            answers.append(
                worker_pb2.CompleteAnswer(dispatch_id=result.dispatch_id, outcome=outcome)
            )
        fault = self._fault("Complete", after=True)
        if fault:
            await abort(context, fault)
        return worker_pb2.CompleteResponse(answers=answers)

    async def Drain(
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.DrainResponse:
        self.drains.append(request)
        fault = self._fault("Drain", after=False)
        if fault:
            await abort(context, fault)
        worker_id = request.session.worker_id
        if self.session_tokens.get(worker_id) != request.session.session_token:
            await abort(context, Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
        for ref in request.hand_back:
            task = self.tasks.get(ref.dispatch_id)
            if task is not None and task.token == ref.lease_token and task.state == "leased":
                task.state = "handed_back"
        held = [t for t in self.tasks.values() if t.state == "leased" and t.holder == worker_id]
        state = "stopped" if not held else "draining"
        if self.sessions.get(worker_id) != "stopped":
            self.sessions[worker_id] = state
        return worker_pb2.DrainResponse(
            session_state={
                "draining": types_pb2.WORKER_STATE_DRAINING,
                "stopped": types_pb2.WORKER_STATE_STOPPED,
            }[self.sessions[worker_id]],
            active_leases=len(held),
        )


@dataclass
class FakeServer:
    service: FakeWorkerService
    server: grpc.aio.Server
    address: str

    async def stop(self) -> None:
        await self.server.stop(0)


async def start_fake(service: FakeWorkerService | None = None, port: int = 0) -> FakeServer:
    service = service or FakeWorkerService()
    # No SO_REUSEPORT: a port must never be shared with another test's server.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return FakeServer(service, server, f"127.0.0.1:{bound}")
