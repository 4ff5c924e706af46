"""The worker's connection to awp-server: its channels, the session Register grants,
and the calls. Register, Drain and GetUpstreamOutputs retry transient errors themselves
(tenacity); a permanent error ends the session (``SessionLost``). Claim and Complete
leave their retries to their callers, which back off in their own way.

Sessions live in the database, so any server of the cluster serves any session. Given
several addresses (``--server a:1,b:2``), the session uses one at a time and moves to
the next when a call finds its server unreachable (``failed``): a server stopped by a
rolling deploy, even in the middle of this worker's drain, costs a retry, not the
session. One address (a load balancer or a Kubernetes Service) gets the same from the
channel's own reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    stop_never,
    wait_exponential,
    wait_random,
)

from awp.v1 import session_pb2, streams_pb2, worker_pb2, worker_pb2_grpc
from awp_common import tls
from awp_protocol.jsonvalue import parse_object
from awp_protocol.limits import PROTOCOL_VERSION
from awp_worker._config import WorkerConfig
from awp_worker._errors import (
    Kind,
    Metadata,
    classify,
    describe,
    is_transient,
    session_lost,
    unreachable,
)
from awp_worker._lease import seconds
from awp_worker._metrics import Metrics

log = logging.getLogger("awp_worker.session")
HeartbeatCall = grpc.aio.StreamStreamCall[worker_pb2.HeartbeatRequest, worker_pb2.HeartbeatResponse]


# The shortest deadline a Drain is sent with, even right at its give-up time.
_LAST_CALL_S = 0.1

# How many answers in a row must say "plaintext meets TLS" before registering gives up.
TLS_MISMATCH_ANSWERS = 3


class TlsMismatch(Exception):
    """The worker and the server disagree about TLS: no retry can fix the settings."""


class Session:
    """``open()`` inside the running loop, then ``register()``; ``close()`` at the end."""

    def __init__(self, config: WorkerConfig, metrics: Metrics) -> None:
        self._config = config
        self._metrics = metrics
        self._metadata: Metadata = (
            (("authorization", f"Bearer {config.worker_token}"),) if config.worker_token else None
        )
        self._addresses = config.servers
        # One channel per address (connected on first use); calls go through the current one.
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[worker_pb2_grpc.WorkerServiceAsyncStub] = []
        self._current = 0
        self._token: session_pb2.Session | None = None
        self.worker_id: str | None = None
        # What the server decides; these stand until Register says otherwise.
        self.heartbeat_interval = 5.0
        self.lease_ttl = 15.0

    def open(self) -> None:
        """Create the channels; OSError if a TLS file cannot be read."""
        # No receive limit of our own: gRPC's default 4 MiB takes every answer, which
        # the server keeps within MAX_RESPONSE_BYTES (awp_protocol.limits).
        options = [
            # gRPC's own reconnect backoff starts at 1 s and grows to 2 min; a restarted
            # server must be found again well within the stream grace.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.primary_user_agent", "awp-worker"),
        ]
        for address in self._addresses:
            channel = tls.channel(address, self._config.client_tls, options)
            self._channels.append(channel)
            # An aio channel makes the generated stub asynchronous (its .pyi says so).
            self._stubs.append(worker_pb2_grpc.WorkerServiceStub(channel))

    async def close(self) -> None:
        # Every call was cancelled with its task (supervisor closed) before this.
        for channel in self._channels:
            await channel.close()

    @property
    def address(self) -> str:
        """The server address calls go to now."""
        return self._addresses[self._current]

    def route(self) -> tuple[int, worker_pb2_grpc.WorkerServiceAsyncStub]:
        """The current address's index (to hand ``failed``) and its stub."""
        assert self._stubs, "open() first"
        return self._current, self._stubs[self._current]

    def failed(self, route: int, error: BaseException) -> None:
        """A call sent through ``route`` failed: if its server was unreachable, the next
        calls go to the next address. Calls that failed on an address already left
        behind change nothing, so one outage moves the session once."""
        if len(self._addresses) < 2 or route != self._current or not unreachable(error):
            return
        self._current = (route + 1) % len(self._addresses)
        log.warning(
            "awp-server %s unreachable (%s); moving to %s",
            self._addresses[route],
            describe(error),
            self.address,
        )

    @property
    def token(self) -> session_pb2.Session:
        assert self._token is not None, "not registered"
        return self._token

    async def register(self) -> worker_pb2.RegisterResponse:
        """Register, retrying transient errors for as long as it takes (the caller
        gives up by cancelling); SessionLost if the server refuses for good (a bad
        token, an unsupported protocol, an invalid request)."""
        config = self._config
        request = worker_pb2.RegisterRequest(
            name=config.name,
            protocol_version=PROTOCOL_VERSION,
            executor_kinds=list(config.kinds),
            max_concurrency=config.concurrency,
            labels=dict(config.labels),
            models=list(config.models),
            resources=dict(config.resources),
        )

        tls_on = config.client_tls.on
        # The same answer a few times in a row: a server restarting closes connections
        # too, but not every time for a second.
        mismatches: list[str] = []

        def tls_verdict(route: int, exc: grpc.RpcError) -> None:
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else None
            found = tls.mismatch(details or "", tls_on)
            mismatches[:] = [*mismatches, found] if found else []
            if found and (tls_on or len(mismatches) >= TLS_MISMATCH_ANSWERS):
                address = self._addresses[route]
                raise TlsMismatch(f"cannot register with {address}: {found}") from exc

        async def call() -> worker_pb2.RegisterResponse:
            response: worker_pb2.RegisterResponse = await self._call(
                "Register", request, config.rpc_timeout, on_error=tls_verdict
            )
            return response

        retrying = _retrying("Register", first=0.25, longest=5.0)
        try:
            response: worker_pb2.RegisterResponse = await retrying(call)
        except grpc.RpcError as exc:
            raise session_lost(exc) from None
        self._token = response.session
        self.worker_id = response.session.worker_id
        if response.HasField("heartbeat_interval") and seconds(response.heartbeat_interval) > 0:
            self.heartbeat_interval = seconds(response.heartbeat_interval)
        if response.HasField("lease_ttl") and seconds(response.lease_ttl) > 0:
            self.lease_ttl = seconds(response.lease_ttl)
        return response

    async def claim(self, max_leases: int) -> worker_pb2.ClaimResponse:
        """One long-polling Claim; raises the call's RpcError."""
        wait = duration_pb2.Duration()
        wait.FromNanoseconds(int(self._config.claim_wait * 1e9))
        request = worker_pb2.ClaimRequest(session=self.token, max_leases=max_leases, wait=wait)
        response: worker_pb2.ClaimResponse = await self._call(
            "Claim", request, self._config.claim_wait + self._config.rpc_timeout
        )
        return response

    async def complete(
        self, results: Sequence[worker_pb2.TaskResult], claim_max_leases: int = 0
    ) -> worker_pb2.CompleteResponse:
        """One Complete, also claiming up to claim_max_leases leases (its answer's
        leases); raises the call's RpcError."""
        request = worker_pb2.CompleteRequest(
            session=self.token, results=results, claim_max_leases=claim_max_leases
        )
        self._metrics.complete_batch.observe(len(results))
        try:
            response: worker_pb2.CompleteResponse = await self._call(
                "Complete", request, self._config.rpc_timeout
            )
        except grpc.RpcError:
            self._metrics.complete_calls.labels("error").inc()
            raise
        self._metrics.complete_calls.labels("ok").inc()
        return response

    async def upstream_outputs(self, lease: worker_pb2.Lease) -> dict[str, dict[str, Any]]:
        """The upstream outputs the lease left out, a page at a time, transient errors
        retried for as long as it takes (the attempt's safety deadline bounds the caller);
        raises the RpcError of a refusal (LEASE_LOST: the lease is gone)."""
        found: dict[str, dict[str, Any]] = {}
        wanted = list(lease.omitted_upstream_keys)
        retrying = _retrying("GetUpstreamOutputs", first=0.1, longest=2.0)
        while wanted:
            request = worker_pb2.GetUpstreamOutputsRequest(
                session=self.token,
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                keys=wanted,
            )
            response: worker_pb2.GetUpstreamOutputsResponse = await retrying(
                self._call, "GetUpstreamOutputs", request, self._config.rpc_timeout
            )
            if not response.outputs:
                raise RuntimeError("GetUpstreamOutputs answered no output")
            for output in response.outputs:
                found[output.key] = parse_object(output.output_json)
            wanted = [key for key in wanted if key not in found]
        return found

    async def _call(
        self,
        method: str,
        request: Any,
        within: float,
        on_error: Callable[[int, grpc.RpcError], None] | None = None,
    ) -> Any:
        """One unary call on the current route, answered ``within`` seconds. A failure
        is shown to ``on_error`` (which may raise something else) and to ``failed``,
        which moves the session off an unreachable server, then re-raised for the
        caller's own retry policy."""
        route, stub = self.route()
        try:
            return await getattr(stub, method)(request, timeout=within, metadata=self._metadata)
        except grpc.RpcError as exc:
            if on_error is not None:
                on_error(route, exc)
            self.failed(route, exc)
            raise

    async def append_stream(
        self, request: streams_pb2.AppendStreamRequest
    ) -> streams_pb2.AppendStreamResponse:
        """One AppendStream (the session filled in); raises the call's RpcError."""
        request.session.CopyFrom(self.token)
        route, stub = self.route()
        try:
            response: streams_pb2.AppendStreamResponse = await stub.AppendStream(
                request, timeout=self._config.rpc_timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            self.failed(route, exc)
            raise
        return response

    async def lease_call(self, method: str, request: Any) -> Any:
        """One call acting on a lease (LoadCheckpoints, RecordStep, Await), the session
        filled in; raises the call's RpcError (the caller retries)."""
        request.session.CopyFrom(self.token)
        return await self._call(method, request, self._config.rpc_timeout)

    def heartbeat(self) -> tuple[int, HeartbeatCall]:
        """Open one heartbeat stream; its route, for ``failed``, and the call."""
        route, stub = self.route()
        call: HeartbeatCall = stub.Heartbeat(metadata=self._metadata)
        return route, call

    def heartbeat_request(
        self, leases: Sequence[worker_pb2.LeaseRef]
    ) -> worker_pb2.HeartbeatRequest:
        return worker_pb2.HeartbeatRequest(session=self.token, leases=leases)

    async def drain(
        self, hand_back: Sequence[worker_pb2.LeaseRef], give_up_after: float
    ) -> worker_pb2.DrainResponse | None:
        """Drain with retries on transient errors (moving to the next address when a
        server is unreachable); None if it could not be delivered within give_up_after
        seconds, which bound the retries and the calls together.
        Raises SessionLost on a permanent session error."""
        request = worker_pb2.DrainRequest(session=self.token, hand_back=hand_back)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + give_up_after

        async def call() -> worker_pb2.DrainResponse:
            remaining = max(deadline - loop.time(), _LAST_CALL_S)
            response: worker_pb2.DrainResponse = await self._call(
                "Drain", request, min(self._config.rpc_timeout, remaining)
            )
            return response

        retrying = _retrying("Drain", first=0.1, longest=2.0, give_up_after=give_up_after)
        try:
            return await retrying(call)
        except grpc.RpcError as exc:
            if classify(exc) is Kind.PERMANENT:
                raise session_lost(exc) from None
            log.error("Drain failed (%s)", describe(exc))
            return None


def _retrying(
    what: str, *, first: float, longest: float, give_up_after: float | None = None
) -> AsyncRetrying:
    """The one retry policy of the session's calls: transient errors only (a
    ``TlsMismatch`` is final), exponential backoff from ``first`` to ``longest`` seconds
    with jitter of up to ``first``, forever unless ``give_up_after`` seconds bound it."""
    return AsyncRetrying(
        retry=retry_if_exception(
            lambda exc: is_transient(exc) and not isinstance(exc, TlsMismatch)
        ),
        wait=wait_exponential(multiplier=first, max=longest) + wait_random(0, first),
        stop=stop_before_delay(give_up_after) if give_up_after is not None else stop_never,
        before_sleep=_log_retry(what),
        reraise=True,
    )


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
