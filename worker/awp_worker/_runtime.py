"""The worker runtime: one session, from Register to the last Drain (DESIGN.md §4, §8).

Four kinds of task run under one supervisor: the heartbeat stream, the claim loop,
the result flusher and one executor task per held lease. The first unexpected failure
stops the rest. ``request_shutdown()`` (SIGTERM) drains: no new claims, heartbeats
go on, running leases finish within the shutdown timeout, then a final Drain stops
the session. A second request, or the timeout, cancels what still runs and hands
those leases back in the final Drain so they are retried at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from awp.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.limits import PROTOCOL_VERSION
from awp_worker._backoff import Backoff
from awp_worker._completer import ResultFlusher
from awp_worker._config import WorkerConfig
from awp_worker._errors import (
    Kind,
    Metadata,
    SessionLost,
    classify,
    describe,
    error_reason,
    is_transient,
    session_lost,
)
from awp_worker._executors import (
    Executor,
    MockExecutor,
    PythonExecutor,
    failure,
    failure_from_exception,
    output_struct,
    success,
)
from awp_worker._heartbeat import HeartbeatStream
from awp_worker._lease import HeldLease, LeaseClock, LeaseTable, Phase, seconds
from awp_worker._logging import LeaseLog, bind, unbind
from awp_worker._metrics import Metrics
from awp_worker._sdk import ActionContext, ActionRegistry
from awp_worker._supervisor import Supervisor

log = logging.getLogger("awp_worker.runtime")
T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILURE = 1  # an internal failure, or the final Drain could not be delivered
EXIT_USAGE = 2
EXIT_SESSION_LOST = 3  # permanent session/protocol error: restart and register anew

_COMPLETE_OUTCOMES = {
    worker_pb2.COMPLETE_OUTCOME_ACCEPTED: "accepted",
    worker_pb2.COMPLETE_OUTCOME_DUPLICATE: "duplicate",
    worker_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT: "result_conflict",
    worker_pb2.COMPLETE_OUTCOME_LEASE_LOST: "lease_lost",
}
_MAX_RECEIVE_BYTES = 128 * 1024 * 1024  # a Claim may carry 1,000 inputs of 64 KiB


def default_executors(
    config: WorkerConfig, registry: ActionRegistry | None = None
) -> dict[str, Executor]:
    """The built-in executors for the configured kinds (``mock``, ``python``)."""
    executors: dict[str, Executor] = {}
    for kind in config.kinds:
        if kind == "mock":
            executors[kind] = MockExecutor()
        elif kind == "python":
            # Headroom: a cancelled sync action keeps its thread until it returns.
            executors[kind] = PythonExecutor(registry, max_threads=config.concurrency + 4)
    return executors


class WorkerRuntime:
    """One worker process's session. ``await run()`` returns the process exit code.

    Construct it inside or outside a loop; ``run()`` creates the gRPC channel in the
    running loop. ``executors`` maps executor kinds to executors (default: the
    built-in ones for ``config.kinds``); every configured kind needs one.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        executors: Mapping[str, Executor] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.executors: dict[str, Executor] = (
            dict(executors) if executors is not None else default_executors(config)
        )
        missing = [kind for kind in config.kinds if kind not in self.executors]
        if missing:
            raise ValueError(f"no executor for kind(s) {', '.join(missing)}")
        self.metrics = metrics if metrics is not None else Metrics()
        self.worker_id: str | None = None
        self.exit_code: int | None = None
        self.heartbeat_interval = 5.0
        self.lease_ttl = 15.0
        self._metadata: Metadata = (
            (("authorization", f"Bearer {config.token}"),) if config.token else None
        )
        self._shutdown_requests = 0
        self._shutdown = asyncio.Event()  # first request: drain
        self._force = asyncio.Event()  # second request: stop now
        self._drain_started = asyncio.Event()
        self._claim_wake = asyncio.Event()  # a slot freed (or draining began)
        self._changed = asyncio.Event()  # a lease went away / the claim loop ended
        self._registered = asyncio.Event()
        self._leases = LeaseTable(self._on_release)
        # Leases given up locally (safety deadline, rejected result) that the server
        # may still count as held: dispatch id -> (ref, local lease expiry). Handed
        # back in the last Drain; forgotten once the server has surely settled them.
        self._abandoned: dict[int, tuple[worker_pb2.LeaseRef, float]] = {}
        self._draining = False
        self._session_stopped = False
        self._stub: worker_pb2_grpc.WorkerServiceAsyncStub | None = None
        self._session: worker_pb2.Session | None = None
        self._sup = Supervisor()
        self._heartbeat: HeartbeatStream | None = None
        self._flusher: ResultFlusher | None = None
        self._side_tasks: dict[str, asyncio.Task[None]] = {}

    # --- public surface -----------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call: drain gracefully. Second call: cancel running leases, hand them
        back, stop. Call it from the loop's thread (e.g. ``loop.add_signal_handler``)."""
        self._shutdown_requests += 1
        if self._shutdown_requests == 1:
            log.info(
                "shutdown requested: draining (up to %gs); request again to stop at once",
                self.config.shutdown_timeout,
            )
            self._shutdown.set()
        elif not self._force.is_set():
            log.info("second shutdown request received")
            self._force.set()

    @property
    def held_leases(self) -> int:
        return len(self._leases)

    @property
    def draining(self) -> bool:
        return self._draining

    async def wait_registered(self) -> str:
        """Wait until Register succeeded; returns the worker id (for tests)."""
        await self._registered.wait()
        assert self.worker_id is not None
        return self.worker_id

    async def run(self) -> int:
        try:
            channel = self._open_channel()
        except OSError as exc:
            log.error("cannot read the TLS CA file: %s", exc)
            return self._exit(EXIT_USAGE)
        metrics_server = None
        try:
            if self.config.metrics_port:
                host, port = self.config.metrics_host, self.config.metrics_port
                try:
                    metrics_server = self.metrics.serve(host, port)
                except OSError as exc:
                    log.error("cannot serve metrics on %s:%d: %s", host, port, exc)
                    return self._exit(EXIT_USAGE)
                log.info("metrics on http://%s:%d/metrics", host, port)
            # An aio channel makes the generated stub asynchronous (its .pyi says so).
            self._stub = worker_pb2_grpc.WorkerServiceStub(channel)
            return self._exit(await self._run())
        finally:
            # Every call was cancelled with its task (supervisor closed) before this.
            await channel.close()
            for executor in self.executors.values():
                close = getattr(executor, "close", None)
                if callable(close):
                    close()
            if metrics_server is not None:
                await asyncio.to_thread(metrics_server.shutdown)
                metrics_server.server_close()

    def _exit(self, code: int) -> int:
        self.exit_code = code
        return code

    # --- session ------------------------------------------------------------------------

    def _open_channel(self) -> grpc.aio.Channel:
        options = [
            ("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
            # gRPC's own reconnect backoff starts at 1 s and grows to 2 min; a restarted
            # server must be found again well within the stream grace.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.primary_user_agent", "awp-worker"),
        ]
        if self.config.tls:
            ca = Path(self.config.tls_ca_file).read_bytes() if self.config.tls_ca_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates=ca)
            return grpc.aio.secure_channel(self.config.server, credentials, options=options)
        return grpc.aio.insecure_channel(self.config.server, options=options)

    @property
    def stub(self) -> worker_pb2_grpc.WorkerServiceAsyncStub:
        assert self._stub is not None, "run() not started"
        return self._stub

    @property
    def session(self) -> worker_pb2.Session:
        assert self._session is not None, "not registered"
        return self._session

    async def _run(self) -> int:
        try:
            registered = await self._register()
        except SessionLost as exc:
            log.error("registration refused permanently (%s); exiting", exc)
            return EXIT_SESSION_LOST
        if registered is None:
            log.info("shutdown requested before registration finished; exiting")
            return EXIT_OK
        self._session = registered.session
        self.worker_id = registered.session.worker_id
        if registered.HasField("heartbeat_interval") and seconds(registered.heartbeat_interval) > 0:
            self.heartbeat_interval = seconds(registered.heartbeat_interval)
        if registered.HasField("lease_ttl") and seconds(registered.lease_ttl) > 0:
            self.lease_ttl = seconds(registered.lease_ttl)
        token = bind(worker_id=self.worker_id)
        try:
            log.info(
                "registered as %s (kinds %s, concurrency %d, heartbeat every %gs, lease TTL %gs)",
                self.config.name,
                ",".join(self.config.kinds),
                self.config.concurrency,
                self.heartbeat_interval,
                self.lease_ttl,
            )
            self._registered.set()
            self._start_side_tasks()
            try:
                await self._wait_first(events=(self._shutdown, self._sup.failed))
                if self._sup.failure is not None:
                    return await self._abort()
                return await self._drain()
            finally:
                await self._sup.close(within=5.0)
        finally:
            unbind(token)

    async def _register(self) -> worker_pb2.RegisterResponse | None:
        request = worker_pb2.RegisterRequest(
            name=self.config.name,
            protocol_version=PROTOCOL_VERSION,
            executor_kinds=list(self.config.kinds),
            max_concurrency=self.config.concurrency,
            labels=dict(self.config.labels),
        )

        async def call() -> worker_pb2.RegisterResponse:
            response: worker_pb2.RegisterResponse = await self.stub.Register(
                request, timeout=self.config.rpc_timeout, metadata=self._metadata
            )
            return response

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.25, max=5.0) + wait_random(0, 0.25),
            before_sleep=_log_retry("Register"),
            reraise=True,
        )

        async def call_with_retries() -> worker_pb2.RegisterResponse:
            response: worker_pb2.RegisterResponse = await retrying(call)
            return response

        task = asyncio.create_task(call_with_retries(), name="register")
        try:
            await self._wait_first(events=(self._shutdown,), tasks=(task,))
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=5.0)
        if not task.done():
            return None  # stuck in gRPC; closing the channel ends it
        if task.cancelled():
            return None
        error = task.exception()
        if isinstance(error, grpc.RpcError):
            # Not transient (tenacity retries those): a bad token, an unsupported
            # protocol, an invalid request. Retrying cannot help.
            raise session_lost(error)
        if error is not None:
            raise error
        return task.result()

    def _start_side_tasks(self) -> None:
        self._heartbeat = HeartbeatStream(
            stub=self.stub,
            metadata=self._metadata,
            request=self._heartbeat_request,
            on_response=self._on_heartbeat,
            should_stop=lambda: self._session_stopped,
            # Once drained with nothing held, a session the server already stopped is
            # the expected end, not a loss.
            loss_expected=lambda: self._draining and not self._leases,
            interval=self.heartbeat_interval,
            # Capped at the heartbeat interval too: a worker that stays away longer than
            # an interval or two risks its leases, so it keeps knocking at that pace.
            backoff=Backoff(
                self.config.reconnect_initial,
                max(
                    self.config.reconnect_initial,
                    min(self.config.reconnect_max, self.heartbeat_interval),
                ),
            ),
            metrics=self.metrics,
        )
        self._flusher = ResultFlusher(
            send=self._send_complete,
            is_current=self._leases.holds,
            on_answer=self._on_complete_answer,
            on_dropped=self._on_result_dropped,
            on_rejected=self._on_result_rejected,
            flush_size=self.config.flush_size,
            flush_interval=self.config.flush_interval,
            held=lambda: len(self._leases),
        )
        spawn = self._sup.spawn
        self._side_tasks = {
            "heartbeat": spawn(self._heartbeat.run(), "heartbeat"),
            "flusher": spawn(self._flusher.run(), "flusher"),
            "claim": spawn(self._claim_loop(), "claim"),
        }
        self._side_tasks["claim"].add_done_callback(lambda _: self._changed.set())

    # --- heartbeat ----------------------------------------------------------------------

    def _heartbeat_request(self) -> worker_pb2.HeartbeatRequest:
        return worker_pb2.HeartbeatRequest(session=self.session, leases=self._leases.refs())

    def _on_heartbeat(self, response: worker_pb2.HeartbeatResponse, now: float) -> None:
        state = response.session_state
        if state == types_pb2.WORKER_STATE_OFFLINE:
            raise SessionLost("OFFLINE", "the server marked this session offline")
        if state == types_pb2.WORKER_STATE_STOPPED:
            if not self._draining:
                raise SessionLost("STOPPED", "the server stopped this session")
            self._session_stopped = True
            self._changed.set()
        elif state == types_pb2.WORKER_STATE_DRAINING and not self._draining:
            log.info("the server put this session in draining")
            self.request_shutdown()
        for answer in response.leases:
            held = self._leases.get(answer.dispatch_id)
            if held is None:
                continue
            if answer.status == worker_pb2.LEASE_STATUS_RENEWED:
                if answer.HasField("lease_remaining"):
                    attempt_remaining = (
                        seconds(answer.attempt_remaining)
                        if answer.HasField("attempt_remaining")
                        else None
                    )
                    held.clock.renew(now, seconds(answer.lease_remaining), attempt_remaining)
                    held.reschedule()
            elif answer.status in (
                worker_pb2.LEASE_STATUS_REVOKED,
                worker_pb2.LEASE_STATUS_UNKNOWN,
            ):
                if held.phase is Phase.REPORTING:
                    # Execution is over and the result is with the flusher (maybe in a
                    # Complete already): its answer, LEASE_LOST, settles the lease once.
                    continue
                status = (
                    "revoked" if answer.status == worker_pb2.LEASE_STATUS_REVOKED else "unknown"
                )
                self._revoke(held, status)

    def _revoke(self, held: HeldLease, status: str) -> None:
        self.metrics.revocations.labels(status).inc()
        LeaseLog(log, held.log_fields).warning(
            "lease %s by the server (%s): stopping it, reporting nothing",
            status,
            held.phase.value,
        )
        self._leases.release(held)
        held.cancel("revoked")

    # --- claiming -----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        config = self.config
        backoff = Backoff(config.claim_backoff_initial, config.claim_backoff_max)
        wait = duration_pb2.Duration()
        wait.FromNanoseconds(int(config.claim_wait * 1e9))
        loop = asyncio.get_running_loop()
        while not self._draining:
            free = config.concurrency - len(self._leases)
            self._claim_wake.clear()
            if free <= 0:
                await self._wait_first(events=(self._claim_wake, self._drain_started))
                continue
            request = worker_pb2.ClaimRequest(session=self.session, max_leases=free, wait=wait)
            started = loop.time()
            try:
                response: worker_pb2.ClaimResponse = await self.stub.Claim(
                    request, timeout=config.claim_wait + config.rpc_timeout, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                if error_reason(exc) == Reason.WORKER_DRAINING:
                    self.metrics.claims.labels("draining").inc()
                    if not self._draining:
                        log.info("the server says this session is draining: no more claims")
                        self.request_shutdown()
                    return
                kind = classify(exc)
                if kind is Kind.PERMANENT:
                    if self._draining:
                        # Our own Drain may have stopped the session before this
                        # Claim arrived: nothing is lost, claiming is over anyway.
                        log.debug("Claim after the drain: %s", describe(exc))
                        return
                    raise session_lost(exc) from None
                self.metrics.claims.labels("error").inc()
                level = logging.WARNING if backoff.failures % 10 == 0 else logging.DEBUG
                log.log(level, "Claim failed (%s); backing off", describe(exc))
                await self._wait_first(events=(self._drain_started,), within=backoff.next())
                continue
            if response.leases:
                self.metrics.claims.labels("leases").inc()
                backoff.reset()
                self._accept(response.leases)
                continue
            self.metrics.claims.labels("empty").inc()
            self.metrics.empty_claims.inc()
            if loop.time() - started >= 0.9 * config.claim_wait > 0:
                # The server held the long poll to its end: that already throttles, so
                # the backoff does not grow (new work must not wait up to its cap).
                backoff.reset()
            await self._wait_first(
                events=(self._claim_wake, self._drain_started), within=backoff.next()
            )

    def _accept(self, leases: Sequence[worker_pb2.Lease]) -> None:
        now = asyncio.get_running_loop().time()
        for lease in leases:
            self.metrics.claimed_leases.inc()
            if self._leases.get(lease.dispatch_id) is not None:
                log.error(
                    "Claim returned dispatch %d twice; ignoring the repeat", lease.dispatch_id
                )
                continue
            held = self._hold(lease, now)
            self._leases.add(held)
            held.task = self._sup.spawn(self._execute(held), f"lease-{lease.dispatch_id}")
        self.metrics.leases_held.set(len(self._leases))

    def _hold(self, lease: worker_pb2.Lease, now: float) -> HeldLease:
        lease_remaining = (
            seconds(lease.lease_remaining) if lease.HasField("lease_remaining") else self.lease_ttl
        )
        attempt_remaining = (
            seconds(lease.attempt_remaining) if lease.HasField("attempt_remaining") else math.inf
        )
        clock = LeaseClock.start(now, lease_remaining, attempt_remaining, self.config.safety_margin)
        fields: dict[str, Any] = {
            "run_id": lease.run_id,
            "task_key": lease.task_key,
            "attempt": lease.attempt,
            "worker_id": self.worker_id,
            "dispatch_id": lease.dispatch_id,
            "action": lease.action,
        }
        ctx = ActionContext(
            run_id=lease.run_id,
            task_key=lease.task_key,
            action=lease.action,
            attempt=lease.attempt,
            max_attempts=lease.max_attempts,
            idempotency_key=lease.idempotency_key,
            fencing_token=lease.fencing_token,
            deadline=clock.attempt_safety_deadline,
            worker_id=self.worker_id or "",
            run_input=struct_to_dict(lease.run_input),
            upstream={key: struct_to_dict(out) for key, out in lease.upstream_outputs.items()},
        )
        return HeldLease(lease=lease, clock=clock, ctx=ctx, log_fields=fields)

    # --- executing ----------------------------------------------------------------------

    async def _execute(self, held: HeldLease) -> None:
        bind(**held.log_fields)  # this task's context only: user log lines carry them too
        lease = held.lease
        kind = lease.executor_kind
        lease_log = LeaseLog(log, held.log_fields)
        executor = self.executors.get(kind)
        started = time.monotonic()
        lease_log.debug("executing %s (%s)", lease.action, kind)
        try:
            if executor is None:
                result: worker_pb2.TaskResult | None = failure(
                    lease, f"this worker has no executor for kind {kind!r}", retryable=False
                )
            else:
                result = await self._run_executor(held, executor, lease_log)
        except asyncio.CancelledError:
            held.ctx._cancel()
            self.metrics.executions.labels(kind, "cancelled").inc()
            lease_log.info("execution cancelled (%s)", held.cancel_reason or "worker stopping")
            raise
        finally:
            held.timeout = None
            self.metrics.execution_seconds.labels(kind).observe(time.monotonic() - started)
        if result is None:
            self.metrics.executions.labels(kind, "safety_deadline").inc()
            self._give_up_locally(held)
            return
        succeeded = result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
        self.metrics.executions.labels(kind, "succeeded" if succeeded else "failed").inc()
        self._report(held, result, lease_log)

    async def _run_executor(
        self, held: HeldLease, executor: Executor, lease_log: LeaseLog
    ) -> worker_pb2.TaskResult | None:
        """The attempt's result, or None if the local safety deadline cut it off."""
        lease = held.lease
        try:
            async with asyncio.timeout_at(held.clock.safety_deadline) as timeout:
                held.timeout = timeout
                output = await executor.execute(held.ctx, struct_to_dict(lease.input))
            if timeout.expired():  # the action swallowed the cancellation and returned
                self._safety_deadline_passed(held, lease_log)
                return None
            return success(lease, output_struct(output))
        except TimeoutError as exc:
            if held.timeout is not None and held.timeout.expired():
                self._safety_deadline_passed(held, lease_log)
                return None
            return failure_from_exception(lease, exc)  # the action's own timeout
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or held.cancel_reason is not None:
                raise
            # The action raised CancelledError by itself (nobody cancelled this task).
            return failure(lease, "the action raised CancelledError", retryable=True)
        except Exception as exc:
            return failure_from_exception(lease, exc)

    def _safety_deadline_passed(self, held: HeldLease, lease_log: LeaseLog) -> None:
        held.ctx._cancel()
        self.metrics.safety_cancellations.inc()
        lease_log.warning(
            "safety deadline passed (the lease could no longer be confirmed): "
            "execution cancelled, nothing reported"
        )

    # --- reporting ----------------------------------------------------------------------

    def _report(self, held: HeldLease, result: worker_pb2.TaskResult, lease_log: LeaseLog) -> None:
        if result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED:
            lease_log.debug("succeeded")
        else:
            lease_log.info(
                "failed (%s): %s",
                "retryable" if result.error.retryable else "permanent",
                result.error.message,
            )
        if not self._leases.holds(held):
            # Revoked while the action ran: the server no longer wants this result.
            self.metrics.completes.labels("dropped").inc()
            return
        held.result = result
        held.phase = Phase.REPORTING
        assert self._flusher is not None
        self._flusher.submit(held)

    def _give_up_locally(self, held: HeldLease) -> None:
        """Stop holding a lease the worker can no longer vouch for (no report)."""
        if not self._leases.release(held):
            return
        now = asyncio.get_running_loop().time()
        # The reaper settles expired leases within seconds; a minute later a hand-back
        # of them would be a no-op, so the list stays small on a long-lived worker.
        stale = [d for d, (_, expiry) in self._abandoned.items() if expiry < now - 60.0]
        for dispatch_id in stale:
            del self._abandoned[dispatch_id]
        self._abandoned[held.dispatch_id] = (held.ref(), held.clock.lease_expiry)

    async def _send_complete(
        self, results: Sequence[worker_pb2.TaskResult]
    ) -> worker_pb2.CompleteResponse:
        request = worker_pb2.CompleteRequest(session=self.session, results=results)
        self.metrics.complete_batch.observe(len(results))
        try:
            response: worker_pb2.CompleteResponse = await self.stub.Complete(
                request, timeout=self.config.rpc_timeout, metadata=self._metadata
            )
        except grpc.RpcError:
            self.metrics.complete_calls.labels("error").inc()
            raise
        self.metrics.complete_calls.labels("ok").inc()
        return response

    def _on_complete_answer(
        self, held: HeldLease, outcome: worker_pb2.CompleteOutcome.ValueType
    ) -> None:
        name = _COMPLETE_OUTCOMES.get(outcome, "unspecified")
        self.metrics.completes.labels(name).inc()
        lease_log = LeaseLog(log, held.log_fields)
        if outcome == worker_pb2.COMPLETE_OUTCOME_ACCEPTED:
            lease_log.debug("result accepted")
        elif outcome == worker_pb2.COMPLETE_OUTCOME_DUPLICATE:
            lease_log.info("result was already recorded (duplicate)")
        elif outcome == worker_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT:
            lease_log.warning("the server holds a different result for this lease; ours dropped")
        elif outcome == worker_pb2.COMPLETE_OUTCOME_LEASE_LOST:
            lease_log.warning("lease lost before the result arrived; the server discarded it")
        else:
            lease_log.warning("the server gave no usable answer for this result (%s)", outcome)
        self._leases.release(held)

    def _on_result_dropped(self, held: HeldLease) -> None:
        self.metrics.completes.labels("dropped").inc()
        LeaseLog(log, held.log_fields).debug("lease revoked before its result was sent: dropped")

    def _on_result_rejected(self, held: HeldLease, why: str) -> None:
        self.metrics.completes.labels("rejected").inc()
        LeaseLog(log, held.log_fields).error(
            "the server rejected this result (%s); giving the lease up so it is retried", why
        )
        self._give_up_locally(held)

    def _on_release(self) -> None:
        self.metrics.leases_held.set(len(self._leases))
        self._claim_wake.set()
        self._changed.set()

    # --- stopping -----------------------------------------------------------------------

    async def _drain(self) -> int:
        """Graceful: stop claiming, let leases finish, Drain twice."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_timeout
        self._draining = True
        self._drain_started.set()
        log.info(
            "draining: no new claims; waiting up to %gs for %d held leases",
            self.config.shutdown_timeout,
            len(self._leases),
        )
        # The first Drain (retried while the server is unreachable) gives way to a
        # second shutdown request or a failure; the final Drain follows either way.
        call = asyncio.create_task(
            self._drain_call([], give_up_after=max(1.0, deadline - loop.time())), name="drain"
        )
        try:
            await self._wait_first(tasks=(call,), events=(self._force, self._sup.failed))
        finally:
            if not call.done():
                call.cancel()
                await asyncio.wait({call}, timeout=5.0)
        if call.done() and not call.cancelled():
            error = call.exception()
            if isinstance(error, SessionLost):
                return await self._abort_session_lost(error)
            if error is not None:
                raise error
            first = call.result()
            if first is not None and first.session_state == types_pb2.WORKER_STATE_STOPPED:
                self._session_stopped = True
                # The server stops a session only once it holds none of its leases: any
                # still running here were revoked (say, their run canceled) before a
                # heartbeat could tell, and no result of theirs can be accepted now.
                for held in list(self._leases):
                    self._revoke(held, "revoked")
        if self._session_stopped:
            await self._sup.cancel([self._side_tasks["claim"]], within=5.0)
        finished = await self._wait_idle(deadline)
        if self._sup.failure is not None:
            return await self._abort()
        if not finished:
            why = "second shutdown request" if self._force.is_set() else "shutdown timeout"
            log.warning(
                "%s: cancelling %d held leases and handing them back", why, len(self._leases)
            )
            return await self._give_up()
        await self._sup.cancel(self._side_tasks.values(), within=5.0)
        hand_back = self._abandoned_refs()
        if self._session_stopped and not hand_back:
            log.info("drained: session stopped")
            return EXIT_OK
        return await self._final_drain(hand_back)

    async def _wait_idle(self, deadline: float) -> bool:
        """True once the claim loop ended and no lease is held; False on timeout, a
        second shutdown request or a supervisor failure."""
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            claim = self._side_tasks["claim"]
            if claim.done() and not self._leases:
                return True
            if self._force.is_set() or self._sup.failed.is_set():
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await self._wait_first(
                events=(self._changed, self._force, self._sup.failed), within=remaining
            )

    async def _give_up(self) -> int:
        """Cancel every running lease, hand all held leases back, stop the session."""
        await self._sup.cancel([self._side_tasks["claim"]], within=5.0)
        running = [held for held in self._leases if held.phase is Phase.RUNNING]
        for held in running:
            held.cancel("shutdown")
        tasks = [held.task for held in running if held.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        # Results already computed get a short chance to be reported.
        await self._wait_reported(within=min(2.0, self.config.rpc_timeout))
        await self._sup.cancel(self._side_tasks.values(), within=5.0)
        hand_back = [held.ref() for held in self._leases] + self._abandoned_refs()
        return await self._final_drain(hand_back)

    async def _wait_reported(self, within: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while any(held.phase is Phase.REPORTING for held in self._leases):
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0 or self._sup.failed.is_set():
                return
            await self._wait_first(events=(self._changed, self._sup.failed), within=remaining)

    def _abandoned_refs(self) -> list[worker_pb2.LeaseRef]:
        # The server settles only leases still held by this session; stale refs are
        # ignored, so every abandoned one can go.
        return [ref for ref, _ in self._abandoned.values()]

    async def _final_drain(self, hand_back: Sequence[worker_pb2.LeaseRef]) -> int:
        try:
            response = await self._drain_call(
                hand_back, give_up_after=max(5.0, self.config.rpc_timeout)
            )
        except SessionLost as exc:
            log.error("final Drain refused (%s); the server settles the leases itself", exc)
            return EXIT_FAILURE
        if response is None:
            return EXIT_FAILURE
        state = types_pb2.WorkerState.Name(response.session_state)
        if response.session_state == types_pb2.WORKER_STATE_STOPPED:
            log.info("drained: session stopped (%d leases handed back)", len(hand_back))
        else:
            log.warning(
                "final Drain left the session %s with %d leases; they expire on their own",
                state,
                response.active_leases,
            )
        return EXIT_OK

    async def _drain_call(
        self, hand_back: Sequence[worker_pb2.LeaseRef], give_up_after: float
    ) -> worker_pb2.DrainResponse | None:
        """Drain with retries on transient errors; None if it could not be delivered.
        Raises SessionLost on a permanent session error."""
        request = worker_pb2.DrainRequest(session=self.session, hand_back=hand_back)

        async def call() -> worker_pb2.DrainResponse:
            response: worker_pb2.DrainResponse = await self.stub.Drain(
                request,
                timeout=min(self.config.rpc_timeout, give_up_after),
                metadata=self._metadata,
            )
            return response

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            stop=stop_after_delay(give_up_after),
            before_sleep=_log_retry("Drain"),
            reraise=True,
        )
        try:
            return await retrying(call)
        except grpc.RpcError as exc:
            if classify(exc) is Kind.PERMANENT:
                raise session_lost(exc) from None
            log.error("Drain failed (%s)", describe(exc))
            return None

    async def _abort(self) -> int:
        failure_ = self._sup.failure
        if isinstance(failure_, SessionLost):
            return await self._abort_session_lost(failure_)
        log.error(
            "worker task %s failed unexpectedly; stopping",
            self._sup.failed_task,
            exc_info=failure_,
        )
        self._draining = True
        self._drain_started.set()
        await self._give_up()
        return EXIT_FAILURE

    async def _abort_session_lost(self, error: SessionLost | None = None) -> int:
        error = error or (self._sup.failure if isinstance(self._sup.failure, SessionLost) else None)
        log.error(
            "session ended permanently (%s): all work stopped, exiting so that a new "
            "worker registers",
            error or Reason.SESSION_INVALID,
        )
        for held in self._leases:
            held.cancel("session lost")
        await self._sup.close(within=5.0)
        return EXIT_SESSION_LOST

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    async def _wait_first(
        *,
        events: Sequence[asyncio.Event] = (),
        tasks: Sequence[asyncio.Future[Any]] = (),
        within: float | None = None,
    ) -> None:
        """Return when any event is set, any task is done, or ``within`` seconds pass."""
        if any(event.is_set() for event in events) or any(task.done() for task in tasks):
            return
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(
                [*waiters, *tasks], timeout=within, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()


def _log_retry(what: str) -> Callable[[RetryCallState], Awaitable[None] | None]:
    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        level = logging.WARNING if state.attempt_number % 10 == 1 else logging.DEBUG
        log.log(
            level,
            "%s failed (%s); retrying in %.2fs (attempt %d)",
            what,
            describe(error) if error is not None else "?",
            delay,
            state.attempt_number,
        )

    return before_sleep
