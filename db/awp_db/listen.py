"""LISTEN/NOTIFY on a dedicated connection, reconnected when lost.

Listening is session state: it needs a connection of its own that is one PostgreSQL
session for its whole life, never a pooled one (behind a transaction pooler its dsn is
--session-database-url; docs/postgres.md). A lost LISTEN connection is silent, hence
the keepalive; after any reconnect every waiter is woken, because notifications may have
been missed while disconnected. Every wake-up is only a latency optimisation: callers re-read the
database and also poll on a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

import asyncpg

from awp_db.connect import connect

log = logging.getLogger("awp.db.listen")


class Waiter:
    """Set when a matching notification (or a reconnect) arrives."""

    def __init__(self, key: str | None) -> None:
        self.key = key
        self._event = asyncio.Event()

    def wake(self) -> None:
        self._event.set()

    def notify(self, payload: str) -> None:
        if self.key is None or self.key == payload:
            self.wake()

    async def wait(self, seconds: float) -> bool:
        """True if woken within the time; re-arms for the next wait."""
        try:
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return False
        self._event.clear()
        return True


class Relay(Waiter):
    """Wakes another waiter on the notifications whose payload is one of `payloads` (and
    on a reconnect): one waiter woken by several channels, each with its own filter."""

    def __init__(self, target: Waiter, payloads: frozenset[str]) -> None:
        super().__init__(None)
        self._target = target
        self._payloads = payloads

    def wake(self) -> None:
        self._target.wake()

    def notify(self, payload: str) -> None:
        if payload in self._payloads:
            self._target.wake()


class Inbox(Waiter):
    """Collects a channel's payloads for a consumer that needs them, not only a wake-up.

    `missed` is set when notifications may have been lost (a reconnect, or more distinct
    payloads arrived between two takes than `limit`): the consumer then re-reads all it
    cares about instead.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(None)
        self._limit = limit
        self._payloads: set[str] = set()
        self._missed = False

    def notify(self, payload: str) -> None:
        if len(self._payloads) < self._limit:
            self._payloads.add(payload)
        else:
            self._missed = True
        super().wake()

    def wake(self) -> None:
        self._missed = True
        super().wake()

    def take(self) -> tuple[set[str], bool]:
        """The payloads since the last take, and whether some may have been missed."""
        taken, missed = self._payloads, self._missed
        self._payloads, self._missed = set(), False
        return taken, missed


W = TypeVar("W", bound=Waiter)


class Listener:
    def __init__(
        self,
        dsn: str,
        channels: Sequence[str],
        keepalive_s: float = 5.0,
        on_connection_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self._channels = list(channels)
        self._keepalive_s = keepalive_s
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._on_connection_change = on_connection_change

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="awp-listener")

    async def wait_connected(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str, key: str | None = None) -> AsyncIterator[Waiter]:
        """A waiter for notifications on channel (only payload == key when key is set)."""
        async with self.attach(channel, Waiter(key)) as waiter:
            yield waiter

    @contextlib.asynccontextmanager
    async def attach(self, channel: str, waiter: W) -> AsyncIterator[W]:
        """Delivers channel's notifications to waiter (an Inbox, say) while inside."""
        self._waiters[channel].add(waiter)
        try:
            yield waiter
        finally:
            self._waiters[channel].discard(waiter)

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        for waiter in self._waiters.get(channel, ()):
            waiter.notify(str(payload))

    def waiting(self, channel: str) -> int:
        """How many waiters a channel has (operators' gauges, tests' synchronisation)."""
        return len(self._waiters.get(channel, ()))

    def wake_all(self) -> None:
        """Wakes every waiter: after a reconnect, or when the process shuts down."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake()

    def _set_connected(self, connected: bool) -> None:
        if connected:
            self._connected.set()
        else:
            self._connected.clear()
        if self._on_connection_change is not None:
            self._on_connection_change(connected)

    async def _run(self) -> None:
        delay = 0.1
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self._dsn, application_name="awp-listener")
                for channel in self._channels:
                    await conn.add_listener(channel, self._dispatch)
                delay = 0.1
                self._set_connected(True)
                self.wake_all()
                while True:
                    await asyncio.sleep(self._keepalive_s)
                    async with asyncio.timeout(self._keepalive_s):
                        await conn.fetchval("SELECT 1")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("listener connection lost", extra={"error": str(exc)})
            finally:
                if self._connected.is_set():
                    self._set_connected(False)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
