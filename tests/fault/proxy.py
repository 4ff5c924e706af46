"""A TCP proxy on 127.0.0.1 that can cut every connection through it at once.

Network loss as a worker sees it: its HTTP/2 connection to the server dies mid-call (the
kernel would answer a reset), every stream on it with it, and the next connection
attempt must be made from scratch. The proxy keeps listening, so the worker's
reconnect succeeds; only what was in flight is lost.

A partition (partition() .. heal()) is the other kind of loss: nothing is reset, bytes
simply stop arriving either way -- on open connections and on new ones -- as when a
link or a switch goes dark. Whatever was sent meanwhile is delivered on heal(), like
TCP retransmissions after the link is back (if the other end is still there).
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.accepted = 0
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()
        self._upstream: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    def drop_all(self) -> int:
        """Aborts every open connection, both sides (a reset, not a clean close)."""
        writers, self._writers = self._writers, set()
        for writer in writers:
            writer.transport.abort()
        count = len(writers) // 2
        self.dropped += count
        return count

    def partition(self) -> None:
        """From now on nothing crosses the proxy, either way, until heal()."""
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def upstream_ports(self) -> list[int]:
        """The local ports of the proxy's connections to the target: how the target
        (e.g. PostgreSQL's pg_stat_activity.client_port) sees the proxied clients."""
        return [writer.get_extra_info("sockname")[1] for writer in self._upstream]

    @property
    def open_connections(self) -> int:
        return len(self._writers) // 2

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop_all()
        for task in list(self._pipes):
            task.cancel()
        for task in list(self._pipes):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The upstream side of a new connection (OSError when refused)."""
        return await asyncio.open_connection(*self.target)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self._connect()
        except OSError:
            writer.transport.abort()  # the server is down: so is the path to it
            return
        self.accepted += 1
        self._writers.update((writer, up_writer))
        self._upstream.add(up_writer)
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            # Either side closing ends the connection: HTTP/2 never half-closes.
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
            self._pipes.difference_update(pipes)
            self._upstream.discard(up_writer)
            for side in (writer, up_writer):
                self._writers.discard(side)
                side.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
