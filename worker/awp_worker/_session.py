"""The worker's connection to awp-server: one channel, the session Register grants,
and the calls. Register, Drain and GetUpstreamOutputs retry transient errors themselves
(tenacity); a permanent error ends the session (``SessionLost``). Claim and Complete
leave their
retries to their callers, which back off in their own way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

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

from awp.v1 import worker_pb2, worker_pb2_grpc
from awp_common import tls
from awp_protocol.jsonvalue import parse_object
from awp_protocol.limits import PROTOCOL_VERSION
from awp_worker._config import WorkerConfig
from awp_worker._errors import Kind, Metadata, classify, describe, is_transient, session_lost
from awp_worker._lease import seconds
from awp_worker._metrics import Metrics

log = logging.getLogger("awp_worker.session")
HeartbeatCall = grpc.aio.StreamStreamCall[worker_pb2.HeartbeatRequest, worker_pb2.HeartbeatResponse]


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
            (("authorization", f"Bearer {config.token}"),) if config.token else None
        )
        self._channel: grpc.aio.Channel | None = None
        self._stub: worker_pb2_grpc.WorkerServiceAsyncStub | None = None
        self._token: worker_pb2.Session | None = None
        self.worker_id: str | None = None
        # What the server decides; these stand until Register says otherwise.
        self.heartbeat_interval = 5.0
        self.lease_ttl = 15.0

    def open(self) -> None:
        """Create the channel; OSError if a TLS file cannot be read."""
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
        self._channel = tls.channel(self._config.server, self._config.client_tls, options)
        # An aio channel makes the generated stub asynchronous (its .pyi says so).
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)

    async def close(self) -> None:
        # Every call was cancelled with its task (supervisor closed) before this.
        if self._channel is not None:
            await self._channel.close()

    @property
    def stub(self) -> worker_pb2_grpc.WorkerServiceAsyncStub:
        assert self._stub is not None, "open() first"
        return self._stub

    @property
    def token(self) -> worker_pb2.Session:
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
        )

        tls_on = config.client_tls.on
        # The same answer a few times in a row: a server restarting closes connections
        # too, but not every time for a second.
        mismatches: list[str] = []

        async def call() -> worker_pb2.RegisterResponse:
            try:
                response: worker_pb2.RegisterResponse = await self.stub.Register(
                    request, timeout=config.rpc_timeout, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as exc:
                found = tls.mismatch(exc.details() or "", tls_on)
                mismatches[:] = [*mismatches, found] if found else []
                if found and (tls_on or len(mismatches) >= TLS_MISMATCH_ANSWERS):
                    raise TlsMismatch(f"cannot register with {config.server}: {found}") from exc
                raise
            return response

        retrying = AsyncRetrying(
            retry=retry_if_exception(
                lambda exc: is_transient(exc) and not isinstance(exc, TlsMismatch)
            ),
            wait=wait_exponential(multiplier=0.25, max=5.0) + wait_random(0, 0.25),
            before_sleep=_log_retry("Register"),
            reraise=True,
        )
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
        response: worker_pb2.ClaimResponse = await self.stub.Claim(
            request,
            timeout=self._config.claim_wait + self._config.rpc_timeout,
            metadata=self._metadata,
        )
        return response

    async def complete(
        self, results: Sequence[worker_pb2.TaskResult]
    ) -> worker_pb2.CompleteResponse:
        """One Complete; raises the call's RpcError."""
        request = worker_pb2.CompleteRequest(session=self.token, results=results)
        self._metrics.complete_batch.observe(len(results))
        try:
            response: worker_pb2.CompleteResponse = await self.stub.Complete(
                request, timeout=self._config.rpc_timeout, metadata=self._metadata
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
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            before_sleep=_log_retry("GetUpstreamOutputs"),
            reraise=True,
        )
        while wanted:
            request = worker_pb2.GetUpstreamOutputsRequest(
                session=self.token,
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                keys=wanted,
            )
            response: worker_pb2.GetUpstreamOutputsResponse = await retrying(
                self._get_upstream_outputs, request
            )
            if not response.outputs:
                raise RuntimeError("GetUpstreamOutputs answered no output")
            for output in response.outputs:
                found[output.key] = parse_object(output.output_json)
            wanted = [key for key in wanted if key not in found]
        return found

    async def _get_upstream_outputs(
        self, request: worker_pb2.GetUpstreamOutputsRequest
    ) -> worker_pb2.GetUpstreamOutputsResponse:
        response: worker_pb2.GetUpstreamOutputsResponse = await self.stub.GetUpstreamOutputs(
            request, timeout=self._config.rpc_timeout, metadata=self._metadata
        )
        return response

    def heartbeat(self) -> HeartbeatCall:
        """Open one heartbeat stream."""
        call: HeartbeatCall = self.stub.Heartbeat(metadata=self._metadata)
        return call

    def heartbeat_request(
        self, leases: Sequence[worker_pb2.LeaseRef]
    ) -> worker_pb2.HeartbeatRequest:
        return worker_pb2.HeartbeatRequest(session=self.token, leases=leases)

    async def drain(
        self, hand_back: Sequence[worker_pb2.LeaseRef], give_up_after: float
    ) -> worker_pb2.DrainResponse | None:
        """Drain with retries on transient errors; None if it could not be delivered.
        Raises SessionLost on a permanent session error."""
        request = worker_pb2.DrainRequest(session=self.token, hand_back=hand_back)

        async def call() -> worker_pb2.DrainResponse:
            response: worker_pb2.DrainResponse = await self.stub.Drain(
                request,
                timeout=min(self._config.rpc_timeout, give_up_after),
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
