"""WorkerService: the transport of the lease protocol (DESIGN.md §4).

Handlers validate input (text, counts and durations of every request are checked before
them: awp_server.guard) and translate between protobuf and the storage layer; the
rules themselves live in awp_kernel (fencing, retry) and their transactions in
awp_db.leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from awp.v1 import checkpoints_pb2, session_pb2, streams_pb2, worker_pb2, worker_pb2_grpc
from awp_db import leases, outputs, streams, workers
from awp_db.connect import Pool
from awp_db.listen import Listener, Relay
from awp_db.signals import COORDINATOR_CHANNEL, DISPATCH_CHANNEL, MAY_READY
from awp_kernel import errors, tokens
from awp_kernel.fencing import ResultVerdict
from awp_protocol.jsonvalue import canonical_json
from awp_protocol.limits import (
    MAX_CLAIM_WAIT_MS,
    MAX_LEASES_PER_CLAIM,
    MAX_RESULTS_PER_COMPLETE,
    SUPPORTED_PROTOCOL_VERSIONS,
)
from awp_protocol.names import check_register
from awp_protocol.results import check_result
from awp_server import checkpoint_rpcs, delivery, metrics, wait_rpcs
from awp_server.batching import (
    MAX_HEARTBEATS_PER_WRITE,
    ClaimBatcher,
    CompleteBatcher,
    TouchBatcher,
)
from awp_server.config import ServerConfig
from awp_server.convert import WORKER_STATES, duration_from_ms, timestamp
from awp_server.errors import abort, unary
from awp_server.revocations import Revoker, Stream, until_shutdown
from awp_server.streams import chunks_in

log = logging.getLogger("awp.server.worker")

# Even with a notification lost, a parked claim re-checks the database this often.
CLAIM_RECHECK_S = 1.0

_VERDICTS = {
    ResultVerdict.ACCEPTED: session_pb2.COMPLETE_OUTCOME_ACCEPTED,
    ResultVerdict.DUPLICATE: session_pb2.COMPLETE_OUTCOME_DUPLICATE,
    ResultVerdict.RESULT_CONFLICT: session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT,
    ResultVerdict.LEASE_LOST: session_pb2.COMPLETE_OUTCOME_LEASE_LOST,
}
_LEASE_STATUS = {
    "renewed": worker_pb2.LEASE_STATUS_RENEWED,
    "revoked": worker_pb2.LEASE_STATUS_REVOKED,
    "unknown": worker_pb2.LEASE_STATUS_UNKNOWN,
}


def _session(session: session_pb2.Session) -> tuple[str, str]:
    if not session.worker_id or not session.session_token:
        raise errors.invalid("session", "worker_id and session_token are required")
    return session.worker_id, session.session_token


def _lease_refs(refs: Any, field: str) -> list[leases.LeaseRef]:
    found: list[leases.LeaseRef] = []
    seen: set[int] = set()
    for index, ref in enumerate(refs):
        if ref.dispatch_id in seen:
            raise errors.invalid(f"{field}[{index}].dispatch_id", "listed twice")
        seen.add(ref.dispatch_id)
        found.append(leases.LeaseRef(ref.dispatch_id, ref.lease_token))
    return found


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self, pool: Pool, listener: Listener, config: ServerConfig, shutting_down: asyncio.Event
    ) -> None:
        self._pool = pool
        self._listener = listener
        self._config = config
        self._shutting_down = shutting_down
        # Cleanups of broken streams run outside the cancelled handler; keep them alive.
        self._cleanups: set[asyncio.Task[None]] = set()
        # Pushes REVOKED down the streams of this server (run by app.start).
        self.revoker = Revoker(pool, listener)
        # Concurrent Claims and Completes share transactions (one run lock and commit
        # for many workers' calls).
        self.claims = ClaimBatcher(
            pool,
            max_size=MAX_LEASES_PER_CLAIM,
            lease_ttl_ms=config.lease_ttl_ms,
            limits=config.session_limits,
            grant=not config.no_claim_grants,
        )
        self.completes = CompleteBatcher(
            pool,
            max_size=MAX_RESULTS_PER_COMPLETE,
            lease_ttl_ms=config.lease_ttl_ms,
            limits=config.session_limits,
            grant=not config.no_claim_grants,
        )
        # And so do the heartbeats of all streams.
        self.touches = TouchBatcher(
            pool, max_size=MAX_HEARTBEATS_PER_WRITE, limits=config.session_limits
        )

    @unary
    async def Register(
        self, request: worker_pb2.RegisterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.RegisterResponse:
        if request.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
            raise errors.protocol_unsupported(request.protocol_version, SUPPORTED_PROTOCOL_VERSIONS)
        # The same check a worker runs on its settings before it starts.
        check_register(
            request.name,
            list(request.executor_kinds),
            request.max_concurrency,
            dict(request.labels),
            models=list(request.models),
            resources=dict(request.resources),
        )
        registration = await workers.register(
            self._pool,
            request.name,
            request.protocol_version,
            list(request.executor_kinds),
            request.max_concurrency,
            dict(request.labels),
            heartbeat_interval_ms=self._config.heartbeat_interval_ms,
            models=list(request.models),
            resources=dict(request.resources),
        )
        metrics.REGISTRATIONS.inc()
        log.info(
            "worker registered",
            extra={
                "worker_id": str(registration.worker_id),
                "worker_name": request.name,
                "kinds": list(request.executor_kinds),
                "max_concurrency": request.max_concurrency,
            },
        )
        return worker_pb2.RegisterResponse(
            session=session_pb2.Session(
                worker_id=str(registration.worker_id), session_token=registration.session_token
            ),
            heartbeat_interval=duration_from_ms(self._config.heartbeat_interval_ms),
            lease_ttl=duration_from_ms(self._config.lease_ttl_s * 1000),
            stream_grace=duration_from_ms(self._config.stream_grace_s * 1000),
            server_time=timestamp(registration.registered_at),
        )

    @unary
    async def Claim(
        self, request: worker_pb2.ClaimRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.ClaimResponse:
        worker_id, token = _session(request.session)
        if not 1 <= request.max_leases <= MAX_LEASES_PER_CLAIM:
            raise errors.invalid("max_leases", f"must be 1 to {MAX_LEASES_PER_CLAIM}")
        wait_ms = request.wait.ToMilliseconds()
        if not 0 <= wait_ms <= MAX_CLAIM_WAIT_MS:
            raise errors.invalid("wait", f"must be 0 to {MAX_CLAIM_WAIT_MS // 1000} s")
        wait_s = min(wait_ms / 1000, self._config.claim_max_wait_s)
        remaining = context.time_remaining()
        if remaining is not None:
            # Answer (empty) before the client's own deadline cuts the call off.
            wait_s = min(wait_s, max(0.0, remaining - 0.5))
        deadline = time.monotonic() + max(0.0, wait_s)
        # New offers wake a parked Claim, and so does whatever may have made a task
        # ready (a run started, results accepted, a wait resumed): the Claim grants
        # ready tasks itself (awp_db.claims) rather than waiting for the coordinator.
        async with (
            self._listener.subscribe(DISPATCH_CHANNEL) as waiter,
            self._listener.attach(COORDINATOR_CHANNEL, Relay(waiter, MAY_READY)),
        ):
            while True:
                issued = await self.claims.claim(worker_id, token, request.max_leases)
                left = deadline - time.monotonic()
                if issued or left <= 0 or self._shutting_down.is_set():
                    break
                await waiter.wait(min(left, CLAIM_RECHECK_S))
        metrics.CLAIMS.labels("leased" if issued else "empty").inc()
        metrics.LEASES_ISSUED.inc(len(issued))
        answer = worker_pb2.ClaimResponse()
        delivery.leases_into(answer, issued, worker_id)
        return answer

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[worker_pb2.HeartbeatRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.HeartbeatResponse]:
        session: workers.Session | None = None
        token = ""
        epoch: int | None = None
        stopped = False
        stream = Stream()
        metrics.HEARTBEAT_STREAMS.inc()
        try:
            with contextlib.ExitStack() as attached:
                async for request in until_shutdown(request_iterator, stream, self._shutting_down):
                    if request is None:
                        # Revocations pushed (revocations.Revoker): said before the
                        # worker's next heartbeat, with the state last told.
                        yield _revoked(stream)
                        continue
                    worker_id, presented = _session(request.session)
                    refs = _lease_refs(request.leases, "leases")
                    if session is None:
                        async with self._pool.acquire() as conn:
                            session = await workers.authenticate(conn, worker_id, presented)
                            token = presented
                            epoch = await workers.open_stream(conn, session.worker_id)
                        stream.state = session.state
                        attached.enter_context(self.revoker.attached(stream, session.worker_id))
                    elif worker_id != str(session.worker_id) or not tokens.matches(
                        presented, tokens.digest(token)
                    ):
                        raise errors.session_invalid("a stream serves one session")
                    stream.reported = frozenset(ref.dispatch_id for ref in refs)
                    state = await self.touches.touch(session.worker_id)
                    if state is None:
                        raise errors.session_invalid("worker session is no longer live")
                    stream.state = state
                    answers: list[leases.LeaseAnswer] = []
                    if refs:
                        async with self._pool.acquire() as conn:
                            answers = await leases.renew(
                                conn, session.worker_id, refs, self._config.lease_ttl_ms
                            )
                    for answer in answers:
                        metrics.LEASE_ANSWERS.labels(answer.status).inc()
                    stopped = state == "stopped"
                    yield worker_pb2.HeartbeatResponse(
                        session_state=WORKER_STATES.proto(state),
                        leases=[
                            worker_pb2.LeaseState(
                                dispatch_id=a.dispatch_id,
                                status=_LEASE_STATUS[a.status],
                                lease_expires_at=timestamp(a.lease_expires_at),
                                lease_remaining=duration_from_ms(a.lease_remaining_ms),
                                attempt_remaining=duration_from_ms(a.attempt_remaining_ms),
                            )
                            for a in answers
                        ],
                        server_time=_now(),
                    )
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await abort(context, exc)
        finally:
            metrics.HEARTBEAT_STREAMS.dec()
            if session is not None and epoch is not None and not stopped:
                self._stream_ended(session.worker_id, epoch)

    def _stream_ended(self, worker_id: Any, epoch: int) -> None:
        """Without a drain, a vanished stream shortens the worker's leases to the grace.

        Not while this server shuts down: its workers reconnect to the next one.
        """
        if self._shutting_down.is_set():
            return

        async def shorten() -> None:
            try:
                async with self._pool.acquire() as conn:
                    count = await leases.stream_lost(
                        conn, worker_id, epoch, self._config.stream_grace_ms
                    )
                if count:
                    metrics.STREAMS_LOST.inc()
                    log.info(
                        "heartbeat stream lost; leases shortened to the stream grace",
                        extra={"worker_id": str(worker_id), "leases": count},
                    )
            except Exception:
                # The leases then expire at their normal TTL: slower, still correct.
                log.exception("could not shorten leases", extra={"worker_id": str(worker_id)})

        task = asyncio.create_task(shorten())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    @unary
    async def Complete(
        self, request: worker_pb2.CompleteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.CompleteResponse:
        worker_id, token = _session(request.session)
        if not 1 <= len(request.results) <= MAX_RESULTS_PER_COMPLETE:
            raise errors.invalid("results", f"must hold 1 to {MAX_RESULTS_PER_COMPLETE} results")
        results = [check_result(f"results[{i}]", r) for i, r in enumerate(request.results)]
        if len({r.dispatch_id for r in results}) != len(results):
            raise errors.invalid("results", "at most one result per dispatch")
        if not 0 <= request.claim_max_leases <= MAX_LEASES_PER_CLAIM:
            raise errors.invalid("claim_max_leases", f"must be 0 to {MAX_LEASES_PER_CLAIM}")
        cycle = await self.completes.cycle(worker_id, token, results, request.claim_max_leases)
        for verdict in cycle.verdicts:
            metrics.COMPLETES.labels(verdict.value).inc()
        if request.claim_max_leases:
            metrics.COMPLETE_CLAIMS.labels("leased" if cycle.issued else "empty").inc()
            metrics.LEASES_ISSUED.inc(len(cycle.issued))
        answer = worker_pb2.CompleteResponse(
            answers=[
                worker_pb2.CompleteAnswer(dispatch_id=r.dispatch_id, outcome=_VERDICTS[v])
                for r, v in zip(results, cycle.verdicts, strict=True)
            ]
        )
        delivery.leases_into(answer, cycle.issued, worker_id)
        return answer

    @unary
    async def Drain(
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.DrainResponse:
        worker_id, token = _session(request.session)
        hand_back = _lease_refs(request.hand_back, "hand_back")
        async with self._pool.acquire() as conn:
            outcome = await leases.drain(conn, worker_id, token, hand_back)
        metrics.HAND_BACKS.labels("false").inc(outcome.handed_back - outcome.charged)
        metrics.HAND_BACKS.labels("true").inc(outcome.charged)
        log.info(
            "worker drain",
            extra={
                "worker_id": worker_id,
                "state": outcome.state,
                "active_leases": outcome.active_leases,
                "handed_back": outcome.handed_back,
                "hand_backs_charged": outcome.charged,
            },
        )
        return worker_pb2.DrainResponse(
            session_state=WORKER_STATES.proto(outcome.state), active_leases=outcome.active_leases
        )

    @unary
    async def GetUpstreamOutputs(
        self,
        request: worker_pb2.GetUpstreamOutputsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.GetUpstreamOutputsResponse:
        worker_id, token = _session(request.session)
        async with self._pool.acquire() as conn:
            session = await workers.authenticate(conn, worker_id, token)
            found = await outputs.upstream_outputs(
                conn,
                session.worker_id,
                request.dispatch_id,
                request.lease_token,
                list(request.keys),
                delivery.OUTPUTS_BUDGET_BYTES,
            )
        return worker_pb2.GetUpstreamOutputsResponse(
            outputs=[
                worker_pb2.UpstreamOutput(key=key, output_json=canonical_json(output).decode())
                for key, output in found
            ]
        )

    @unary
    async def AppendStream(
        self, request: streams_pb2.AppendStreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> streams_pb2.AppendStreamResponse:
        worker_id, token = _session(request.session)
        chunks = chunks_in(request)
        async with self._pool.acquire() as conn:
            appended = await streams.append(
                conn,
                worker_id,
                token,
                request.dispatch_id,
                request.lease_token,
                request.first_offset,
                chunks,
            )
        metrics.STREAM_APPENDS.labels(appended.verdict.value).inc()
        return streams_pb2.AppendStreamResponse(
            outcome=_VERDICTS[appended.verdict], next_offset=appended.next_offset
        )

    @unary
    async def LoadCheckpoints(
        self,
        request: checkpoints_pb2.LoadCheckpointsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> checkpoints_pb2.LoadCheckpointsResponse:
        worker_id, token = _session(request.session)
        return await checkpoint_rpcs.load_checkpoints(self._pool, worker_id, token, request)

    @unary
    async def RecordStep(
        self,
        request: checkpoints_pb2.RecordStepRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> checkpoints_pb2.RecordStepResponse:
        worker_id, token = _session(request.session)
        verdict = await checkpoint_rpcs.record_step(self._pool, worker_id, token, request)
        return checkpoints_pb2.RecordStepResponse(outcome=_VERDICTS[verdict])

    @unary
    async def Await(
        self, request: checkpoints_pb2.AwaitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> checkpoints_pb2.AwaitResponse:
        worker_id, token = _session(request.session)
        return await wait_rpcs.await_wait(self._pool, worker_id, token, request)


def _revoked(stream: Stream) -> worker_pb2.HeartbeatResponse:
    return worker_pb2.HeartbeatResponse(
        session_state=WORKER_STATES.proto(stream.state),
        leases=[
            worker_pb2.LeaseState(dispatch_id=dispatch_id, status=worker_pb2.LEASE_STATUS_REVOKED)
            for dispatch_id in stream.take()
        ],
        server_time=_now(),
    )


def _now() -> timestamp_pb2.Timestamp:
    value = timestamp_pb2.Timestamp()
    value.GetCurrentTime()
    return value
