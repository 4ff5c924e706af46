"""The session's one heartbeat stream: kept open for the whole session, reopened at once.

The stream is pure transport: what to send comes from ``request()``, what a response
means is decided by ``on_response()`` (it may raise ``SessionLost``). When the stream
breaks the server gives the session's leases only a short grace (1 s by default), so
the first reconnect comes within ~50 ms; later ones back off, capped, with jitter,
until a response proves the new stream healthy. Each new stream starts by sending
the current leases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from awp.v1 import worker_pb2, worker_pb2_grpc
from awp_worker._backoff import Backoff
from awp_worker._errors import Kind, Metadata, classify, describe, session_lost
from awp_worker._metrics import Metrics

log = logging.getLogger("awp_worker.heartbeat")
HeartbeatCall = grpc.aio.StreamStreamCall[worker_pb2.HeartbeatRequest, worker_pb2.HeartbeatResponse]


class StreamStalled(Exception):
    """No response arrived for too long: the connection is presumed dead."""


class HeartbeatStream:
    def __init__(
        self,
        *,
        stub: worker_pb2_grpc.WorkerServiceAsyncStub,
        metadata: Metadata,
        request: Callable[[], worker_pb2.HeartbeatRequest],
        on_response: Callable[[worker_pb2.HeartbeatResponse, float], None],
        should_stop: Callable[[], bool],
        loss_expected: Callable[[], bool],
        interval: float,
        backoff: Backoff,
        metrics: Metrics,
    ) -> None:
        self._stub = stub
        self._metadata = metadata
        self._request = request
        self._on_response = on_response
        self._should_stop = should_stop
        self._loss_expected = loss_expected
        self.interval = interval
        # Answers are immediate; two intervals of silence mean the stream is gone.
        self.stall_timeout = 2 * interval + 1.0
        self._backoff = backoff
        self._metrics = metrics
        self.streams_opened = 0

    async def run(self) -> None:
        """Heartbeat until ``should_stop()``; raises SessionLost when the session is
        over (unless ``loss_expected()``: then it just returns)."""
        while True:
            if self.streams_opened:
                self._metrics.heartbeat_reconnects.inc()
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
                if self._should_stop():
                    return
                log.info("server closed the heartbeat stream; reconnecting")
            await asyncio.sleep(self._backoff.next())

    async def _one_stream(self) -> None:
        call: HeartbeatCall = self._stub.Heartbeat(metadata=self._metadata)
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
            self._on_response(response, loop.time())
            if self._should_stop():
                return

    async def _write(self, call: HeartbeatCall) -> None:
        while True:
            await call.write(self._request())
            self._metrics.heartbeats.inc()
            await asyncio.sleep(self.interval)
