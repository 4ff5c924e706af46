"""REVOKED said first: a lease revoked under its holder is pushed down the holder's
heartbeat stream at once, instead of waiting for the worker's next heartbeat.

Every lease that leaves `leased` for any reason but its holder's result NOTIFYs
LEASE_REVOKED_CHANNEL (the trigger of migration 0012). Each server keeps its open
heartbeat streams by worker session; the `Revoker` takes the notifications for the
sessions it holds, asks the database which are true (`awp_db.revocations.confirmed`, one
query for everything that arrived meanwhile, so a mass cancel is not N queries) and hands
the confirmed dispatch ids to their streams, which write them as REVOKED answers.

Only a latency optimisation: if a notification is lost (the LISTEN connection broke),
every stream's last-reported leases are checked instead, and the periodic heartbeat
revokes whatever is left. docs/design.md, "Cancellation latency".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, TypeVar
from uuid import UUID

import asyncpg

from awp_db import revocations
from awp_db.connect import Pool
from awp_db.listen import Inbox, Listener
from awp_db.signals import LEASE_REVOKED_CHANNEL
from awp_protocol.limits import MAX_WORKER_CONCURRENCY
from awp_server import metrics

log = logging.getLogger("awp.server.revocations")

# Distinct notifications kept between two database checks; past it the check covers
# every stream's reported leases instead (bounded memory under a flood).
MAX_PENDING_NOTIFICATIONS = 10_000
# Dispatch ids in one pushed answer, as many as a heartbeat may list.
MAX_PUSHED_PER_ANSWER = MAX_WORKER_CONCURRENCY

Request = TypeVar("Request")


class Stream:
    """One open heartbeat stream, as the revoker sees it."""

    def __init__(self) -> None:
        # The session state last known on this stream (a pushed answer repeats it).
        self.state = ""
        # The dispatch ids of the worker's last heartbeat.
        self.reported: frozenset[int] = frozenset()
        self._revoked: set[int] = set()
        self._pushed = asyncio.Event()

    def push(self, dispatch_ids: Iterable[int]) -> None:
        self._revoked.update(dispatch_ids)
        if self._revoked:
            self._pushed.set()

    async def wait_pushed(self) -> None:
        await self._pushed.wait()

    def take(self) -> list[int]:
        """The next revoked ids to answer (the rest stay pushed)."""
        taken = sorted(self._revoked)[:MAX_PUSHED_PER_ANSWER]
        self._revoked.difference_update(taken)
        if not self._revoked:
            self._pushed.clear()
        return taken


class Revoker:
    def __init__(self, pool: Pool, listener: Listener) -> None:
        self._pool = pool
        self._listener = listener
        self._streams: dict[UUID, set[Stream]] = defaultdict(set)

    @contextlib.contextmanager
    def attached(self, stream: Stream, worker_id: UUID) -> Iterator[Stream]:
        """Pushes the session's revocations to stream while inside."""
        self._streams[worker_id].add(stream)
        try:
            yield stream
        finally:
            streams = self._streams[worker_id]
            streams.discard(stream)
            if not streams:
                del self._streams[worker_id]

    async def run(self) -> None:
        inbox = Inbox(MAX_PENDING_NOTIFICATIONS)
        async with self._listener.attach(LEASE_REVOKED_CHANNEL, inbox):
            while True:
                # The wait re-arms after each wake; everything that arrives while a
                # check runs is taken together by the next one.
                await inbox.wait(3600.0)
                payloads, missed = inbox.take()
                candidates = self._candidates(payloads, missed)
                if not candidates:
                    continue
                try:
                    async with self._pool.acquire() as conn:
                        revoked = await revocations.confirmed(conn, candidates)
                except (
                    OSError,
                    asyncpg.PostgresError,
                    asyncpg.InterfaceError,
                    TimeoutError,
                ) as exc:
                    # The heartbeats still revoke these, at their own pace.
                    log.warning("could not check revoked leases", extra={"error": repr(exc)})
                    continue
                self._push(revoked)

    def _candidates(self, payloads: set[str], missed: bool) -> set[revocations.Revoked]:
        """The notified leases of sessions this server streams to; after a possible loss,
        every lease those streams last reported."""
        found: set[revocations.Revoked] = set()
        for payload in payloads:
            revoked = revocations.parse(payload)
            if revoked is None:
                log.warning("malformed lease revocation notice", extra={"payload": payload})
            elif revoked.worker_id in self._streams:
                found.add(revoked)
        if missed:
            for worker_id, streams in self._streams.items():
                for stream in streams:
                    found.update(revocations.Revoked(worker_id, d) for d in stream.reported)
        return found

    def _push(self, revoked: list[revocations.Revoked]) -> None:
        by_worker: dict[UUID, set[int]] = defaultdict(set)
        for lease in revoked:
            by_worker[lease.worker_id].add(lease.dispatch_id)
        for worker_id, dispatch_ids in by_worker.items():
            for stream in self._streams.get(worker_id, ()):
                stream.push(dispatch_ids)
            metrics.REVOCATIONS_PUSHED.inc(len(dispatch_ids))
            log.info(
                "lease revocations pushed",
                extra={"worker_id": str(worker_id), "leases": len(dispatch_ids)},
            )


async def until_shutdown(
    requests: AsyncIterator[Request], stream: Stream, shutting_down: asyncio.Event
) -> AsyncIterator[Request | None]:
    """The stream's requests until it ends or this server begins to shut down, and
    None whenever revocations were pushed to the stream.

    Ending the streams at once sends workers to the next server straight away
    instead of leaving them attached to one that refuses every other call.
    """
    iterator = aiter(requests)
    shutdown = asyncio.ensure_future(shutting_down.wait())
    receive: asyncio.Future[Request] | None = None
    pushed: asyncio.Future[None] | None = None
    try:
        while True:
            if receive is None:
                receive = asyncio.ensure_future(anext(iterator))
                receive.add_done_callback(_retrieved)
            if pushed is None:
                pushed = asyncio.ensure_future(stream.wait_pushed())
            waits: set[asyncio.Future[Any]] = {receive, shutdown, pushed}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if shutdown.done() and not receive.done():
                return
            if pushed.done():
                pushed = None
                yield None
            if receive.done():
                try:
                    request = receive.result()
                except StopAsyncIteration:
                    return
                receive = None
                yield request
    finally:
        shutdown.cancel()
        for future in (receive, pushed):
            if future is not None and not future.done():
                future.cancel()


def _retrieved(receive: asyncio.Future[Any]) -> None:
    """Reads a finished receive's exception. A worker killed mid-stream ends the request
    stream (StopAsyncIteration) at the moment the handler is cancelled, so nobody else
    may read it, and asyncio would log "Task exception was never retrieved"."""
    if not receive.cancelled():
        receive.exception()
