"""A WatchStream reader for the stream fault scenarios (test_faults_streams.py): it keeps
everything it received, can be cut off at any moment, and resumes from its last position
like the SDK's reader does."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from uuid import UUID

import grpc
from commandlines import ADMIN_TOKEN

from awp.v1 import control_pb2_grpc, streams_pb2

ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
STARTED = streams_pb2.STREAM_BOUNDARY_KIND_STARTED
ENDED = streams_pb2.STREAM_BOUNDARY_KIND_ENDED


@dataclass
class Reader:
    run_id: UUID
    task_key: str
    chunks: list[streams_pb2.StreamChunk] = field(default_factory=list)
    # (attempt, kind, state) in arrival order, repeats after a resume included.
    boundaries: list[tuple[int, int, int]] = field(default_factory=list)
    # Every boundary and chunk as it arrived: ("chunk", position) or ("boundary", ...).
    log: list[tuple[str, int, int]] = field(default_factory=list)
    ended: bool = False
    connections: int = 0

    @property
    def next_offset(self) -> int:
        return self.chunks[-1].position + 1 if self.chunks else 0

    async def read(self, channel: grpc.aio.Channel) -> None:
        """From next_offset until the stream ends (or the call breaks: raises)."""
        self.connections += 1
        stub = control_pb2_grpc.ControlServiceStub(channel)
        call = stub.WatchStream(
            streams_pb2.WatchStreamRequest(
                run_id=str(self.run_id), task_key=self.task_key, from_offset=self.next_offset
            ),
            metadata=ADMIN,
        )
        async for response in call:
            if response.HasField("boundary"):
                b = response.boundary
                self.boundaries.append((b.attempt, b.kind, b.state))
                self.log.append(("boundary", b.attempt, b.kind))
            for chunk in response.chunks:
                self.chunks.append(chunk)
                self.log.append(("chunk", chunk.position, chunk.attempt))
        self.ended = True

    async def read_resuming(self, channels: list[grpc.aio.Channel], within: float) -> None:
        """Until the end, resuming on the next channel whenever a call breaks."""
        async with asyncio.timeout(within):
            turn = 0
            while not self.ended:
                try:
                    await self.read(channels[turn % len(channels)])
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.INTERNAL,
                    ):
                        raise
                    turn += 1
                    await asyncio.sleep(0.05)

    def positions(self) -> list[int]:
        return [chunk.position for chunk in self.chunks]


@contextlib.asynccontextmanager
async def reading(reader: Reader, channel: grpc.aio.Channel):  # type: ignore[no-untyped-def]
    """Reads in the background; cancelling on exit is the reader being killed."""
    task = asyncio.create_task(reader.read(channel))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task


def texts(chunks: list[streams_pb2.StreamChunk]) -> list[str]:
    return [chunk.text for chunk in chunks]
