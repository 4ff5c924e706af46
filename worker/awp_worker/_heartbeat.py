"""The session's one heartbeat stream: kept open for the whole session, reopened at once.

Every interval it sends the held leases; each answer renews them (moving their local
safety deadlines), revokes them (the executor stops, nothing is reported) or says the
session's state (DRAINING starts this side's drain; STOPPED while draining is the
expected end; OFFLINE, or STOPPED while active, ends the session: ``SessionLost``).
The server also speaks first: a lease revoked under this session (a cancel, say) comes
as an unprompted answer listing it REVOKED, acted on like any other, so the action is
cancelled within milliseconds, not at the next heartbeat. Answers are read as they
come, never paired with requests.

When the stream breaks the server gives the session's leases only a short grace (1 s
by default), so the first reconnect comes within ~50 ms; later ones back off, capped,
with jitter, until a response proves the new stream healthy. Each new stream starts
by sending the current leases.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from awp.v1 import types_pb2, worker_pb2
from awp_worker._attempt import revoke
from awp_worker._backoff import Backoff
from awp_worker._errors import Kind, SessionLost, classify, describe, session_lost
from awp_worker._lease import Phase, seconds
from awp_worker._lifecycle import State
from awp_worker._owner import Owner
from awp_worker._session import HeartbeatCall

log = logging.getLogger("awp_worker.heartbeat")
_REVOKED = {
    worker_pb2.LEASE_STATUS_REVOKED: "revoked",
    worker_pb2.LEASE_STATUS_UNKNOWN: "unknown",
}


class StreamStalled(TimeoutError):
    """No response arrived for too long: the connection is presumed dead."""


class HeartbeatStream:
    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        config = owner.config
        self.interval = owner.session.heartbeat_interval
        # Answers are immediate; two intervals of silence mean the stream is gone.
        self.stall_timeout = 2 * self.interval + 1.0
        # Capped at the heartbeat interval too: a worker that stays away longer than
        # an interval or two risks its leases, so it keeps knocking at that pace.
        self._backoff = Backoff(
            config.reconnect_initial,
            max(config.reconnect_initial, min(config.reconnect_max, self.interval)),
        )
        self.streams_opened = 0

    def _loss_expected(self) -> bool:
        # Once drained with nothing held, a session the server already stopped is the
        # expected end, not a loss.
        return self._owner.lifecycle.state is not State.ACTIVE and not self._owner.leases

    async def run(self) -> None:
        """Heartbeat until the server stopped the session; raises SessionLost when the
        session is over unexpectedly."""
        while True:
            if self.streams_opened:
                self._owner.metrics.heartbeat_reconnects.inc()
            self.streams_opened += 1
            try:
                await self._one_stream()
            except (grpc.RpcError, StreamStalled, asyncio.InvalidStateError) as exc:
                if classify(exc) is Kind.PERMANENT:
                    if self._loss_expected():
                        return
                    raise session_lost(exc) from None
                # Loud for the first break after a healthy stream, then now and then.
                failures = self._backoff.failures
                level = logging.WARNING if failures % 20 == 0 else logging.DEBUG
                log.log(
                    level,
                    "heartbeat stream broke (%s); reconnecting (failures in a row: %d)",
                    describe(exc),
                    failures + 1,
                )
            else:
                if self._owner.lifecycle.server_stopped:
                    return
                log.info("server closed the heartbeat stream; reconnecting")
            await asyncio.sleep(self._backoff.next())

    async def _one_stream(self) -> None:
        route, call = self._owner.session.heartbeat()
        try:
            await self._run_stream(call)
        except (grpc.RpcError, StreamStalled) as exc:
            self._owner.session.failed(route, exc)
            raise

    async def _run_stream(self, call: HeartbeatCall) -> None:
        reader = asyncio.create_task(self._read(call), name="heartbeat-read")
        writer = asyncio.create_task(self._write(call), name="heartbeat-write")
        tasks = {reader, writer}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Cancel the call before anything else so the server sees the stream end.
            call.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=5.0)
        errors = {t: t.exception() for t in (reader, writer) if t.done() and not t.cancelled()}
        # The reader's error carries the server's status: prefer it.
        for task in (reader, writer):
            error = errors.get(task)
            if task in done and error is not None:
                raise error

    async def _read(self, call: HeartbeatCall) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout(self.stall_timeout):
                    response = await call.read()
            except TimeoutError:
                raise StreamStalled(f"no heartbeat answer for {self.stall_timeout:.1f}s") from None
            if response is grpc.aio.EOF:
                return
            assert isinstance(response, worker_pb2.HeartbeatResponse)
            self._backoff.reset()
            self._answered(response, loop.time())
            if self._owner.lifecycle.server_stopped:
                return

    async def _write(self, call: HeartbeatCall) -> None:
        while True:
            await call.write(self._request())
            self._owner.metrics.heartbeats.inc()
            await asyncio.sleep(self.interval)

    def _request(self) -> worker_pb2.HeartbeatRequest:
        return self._owner.session.heartbeat_request(self._owner.leases.refs())

    def _answered(self, response: worker_pb2.HeartbeatResponse, now: float) -> None:
        owner = self._owner
        lifecycle = owner.lifecycle
        state = response.session_state
        if state == types_pb2.WORKER_STATE_OFFLINE:
            raise SessionLost("OFFLINE", "the server marked this session offline")
        if state == types_pb2.WORKER_STATE_STOPPED:
            if lifecycle.state is State.ACTIVE:
                raise SessionLost("STOPPED", "the server stopped this session")
            lifecycle.mark_server_stopped()
        elif state == types_pb2.WORKER_STATE_DRAINING and lifecycle.state is State.ACTIVE:
            log.info("the server put this session in draining")
            owner.request_shutdown()
        for answer in response.leases:
            held = owner.leases.get(answer.dispatch_id)
            if held is None:
                if answer.status in _REVOKED:
                    owner.leases.revoked_before_held(answer.dispatch_id, _REVOKED[answer.status])
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
            elif answer.status in _REVOKED:
                if held.phase is Phase.REPORTING:
                    # Execution is over and the result is with the flusher (maybe in a
                    # Complete already): its answer, LEASE_LOST, settles the lease once.
                    continue
                revoke(owner, held, _REVOKED[answer.status])
