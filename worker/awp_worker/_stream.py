"""An attempt's output stream (``ctx.stream``): chunks buffered, batched and appended
under the attempt's lease (DESIGN.md §15).

One sender per attempt keeps at most one AppendStream in flight: it waits a short
linger for more chunks (or until a batch's byte bound is reached), sends the oldest
unacknowledged chunks from the attempt's next offset, and drops them once stored. A
transient failure resends the same batch (the server answers DUPLICATE for what it
already has), so nothing is lost or stored twice. The buffer is bounded in bytes: a
writer waits while it is full (a slow database slows the action, never grows memory).
LEASE_LOST stops the attempt through the same path as a revoked heartbeat answer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from awp.v1 import session_pb2, streams_pb2, worker_pb2
from awp_protocol.limits import MAX_STREAM_BYTES_PER_ATTEMPT, MAX_STREAM_CHUNKS_PER_APPEND
from awp_sdk.actions import ActionCancelled, PermanentError, stream_chunk
from awp_sdk.threads import call_from_thread
from awp_worker._backoff import Backoff
from awp_worker._errors import describe, is_transient

log = logging.getLogger("awp_worker.stream")

Send = Callable[[streams_pb2.AppendStreamRequest], Awaitable[streams_pb2.AppendStreamResponse]]


@dataclass(frozen=True, slots=True)
class StreamSettings:
    # How long the sender waits for more chunks before sending a batch.
    linger_s: float = 0.005
    # A batch is sent at once when it holds this many bytes.
    batch_bytes: int = 64 * 1024
    # Bytes buffered (written, not yet stored) at most: a writer waits beyond.
    max_buffered_bytes: int = 1024 * 1024


class StreamLost(ActionCancelled):
    """The attempt's stream can take nothing more: its lease is lost."""


class StreamTooLarge(PermanentError):
    """The attempt wrote more than an attempt may stream: the server would refuse it, and
    would again on a retry."""


def encode(chunk: Any) -> streams_pb2.StreamChunkIn:
    """The chunk as AppendStream carries it (awp_sdk.actions.stream_chunk's rule)."""
    text, is_json = stream_chunk(chunk)
    return streams_pb2.StreamChunkIn(json=text) if is_json else streams_pb2.StreamChunkIn(text=text)


class StreamWriter:
    """``ctx.stream`` of one attempt (awp_sdk.actions.OutputStream)."""

    def __init__(
        self,
        lease: worker_pb2.Lease,
        send: Send,
        on_lost: Callable[[str], None],
        settings: StreamSettings,
        log_fields: dict[str, Any],
    ) -> None:
        self._lease = lease
        self._send = send
        self._on_lost = on_lost
        self._settings = settings
        self._fields = log_fields
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._pending: deque[tuple[streams_pb2.StreamChunkIn, int]] = deque()
        self._buffered = 0
        self._offset = 0  # of the first pending chunk
        self._batches = 0  # appends stored, for the attempt's span
        self._written = 0  # UTF-8 bytes of every chunk accepted, for the per-attempt bound
        self._lost: str | None = None
        self._changed = asyncio.Condition()
        self._sender: asyncio.Task[None] | None = None
        self._wakes: set[asyncio.Task[None]] = set()

    # --- the action's side --------------------------------------------------------

    def summary(self) -> tuple[int, int, int]:
        """What was stored so far: chunks, their UTF-8 bytes written, and appends."""
        return self._offset, self._written, self._batches

    def write(self, chunk: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            # An async action calling the sync API: it may not block the loop.
            self._check()
            encoded = encode(chunk)
            if self._pending and self._buffered + encoded.ByteSize() > self._room():
                raise RuntimeError("the stream's buffer is full: use `await ctx.stream.awrite`")
            self._put(encoded)
            wake = self._loop.create_task(self._wake())
            self._wakes.add(wake)
            wake.add_done_callback(self._wakes.discard)
            return
        call_from_thread(self._loop, self.awrite(chunk))

    async def awrite(self, chunk: Any) -> None:
        encoded = encode(chunk)
        size = encoded.ByteSize()
        async with self._changed:
            # One chunk always fits an empty buffer, however large.
            await self._changed.wait_for(
                lambda: (
                    self._lost is not None
                    or not self._pending
                    or self._buffered + size <= self._room()
                )
            )
            self._put(encoded)
            self._changed.notify_all()

    def pipe(self, chunks: Iterable[Any]) -> int:
        count = 0
        for chunk in chunks:
            self.write(chunk)
            count += 1
        return count

    async def apipe(self, chunks: AsyncIterable[Any]) -> int:
        count = 0
        async for chunk in chunks:
            await self.awrite(chunk)
            count += 1
        return count

    # --- the runtime's side -------------------------------------------------------

    async def flush(self) -> None:
        """Until every chunk written is stored; raises StreamLost if the lease is lost."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._lost is not None or not self._pending)
        self._check()

    def close(self) -> None:
        """Stops the sender (the attempt is over, or cancelled)."""
        if self._sender is not None:
            self._sender.cancel()

    # --- internals ----------------------------------------------------------------

    def _room(self) -> int:
        return self._settings.max_buffered_bytes

    def _check(self) -> None:
        if self._lost is not None:
            raise StreamLost(f"the output stream of attempt {self._lease.attempt}: {self._lost}")

    def _put(self, encoded: streams_pb2.StreamChunkIn) -> None:
        self._check()
        size = len(getattr(encoded, encoded.WhichOneof("data") or "text").encode())
        if self._written + size > MAX_STREAM_BYTES_PER_ATTEMPT:
            raise StreamTooLarge(
                f"the output stream would be {self._written + size} bytes, more than the "
                f"{MAX_STREAM_BYTES_PER_ATTEMPT} an attempt may stream"
            )
        self._written += size
        self._pending.append((encoded, encoded.ByteSize()))
        self._buffered += self._pending[-1][1]
        if self._sender is None:
            self._sender = self._loop.create_task(self._run(), name="awp-stream")

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        backoff = Backoff(0.05, 2.0)
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._pending))
            if self._buffered < self._settings.batch_bytes:
                await asyncio.sleep(self._settings.linger_s)
            batch: list[streams_pb2.StreamChunkIn] = []
            size = 0
            for encoded, chunk_size in self._pending:
                if batch and (
                    size + chunk_size > self._settings.batch_bytes
                    or len(batch) == MAX_STREAM_CHUNKS_PER_APPEND
                ):
                    break
                batch.append(encoded)
                size += chunk_size
            request = streams_pb2.AppendStreamRequest(
                dispatch_id=self._lease.dispatch_id,
                lease_token=self._lease.lease_token,
                first_offset=self._offset,
                chunks=batch,
            )
            try:
                response = await self._send(request)
            except grpc.RpcError as exc:
                if is_transient(exc):
                    log.info(
                        "AppendStream failed (%s); resending", describe(exc), extra=self._fields
                    )
                    await asyncio.sleep(backoff.next())
                    continue
                await self._lose(f"AppendStream refused: {describe(exc)}")
                return
            backoff.reset()
            outcome = response.outcome
            if outcome in (
                session_pb2.COMPLETE_OUTCOME_ACCEPTED,
                session_pb2.COMPLETE_OUTCOME_DUPLICATE,
            ):
                async with self._changed:
                    for _ in batch:
                        self._buffered -= self._pending.popleft()[1]
                    self._offset += len(batch)
                    self._batches += 1
                    self._changed.notify_all()
                continue
            reason = (
                "lease lost"
                if outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
                else "another chunk is stored at its offset"
            )
            await self._lose(reason)
            return

    async def _lose(self, reason: str) -> None:
        log.warning("output stream stopped: %s", reason, extra=self._fields)
        async with self._changed:
            self._lost = reason
            self._pending.clear()
            self._buffered = 0
            self._changed.notify_all()
        self._on_lost(reason)
