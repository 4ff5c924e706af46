"""The leader lock: a PostgreSQL session advisory lock on a dedicated connection.

Not from a pool: asyncpg resets pooled connections on release (pg_advisory_unlock_all).
A keepalive proves the connection still works and still holds the lock; the connection's
termination callback reports a loss at once. The lock is for efficiency only (one
coordinator doing the work): every pass is correct with several running at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

from awp_db import coordination
from awp_db.connect import connect
from awp_db.signals import LEADER_LOCK_KEY

log = logging.getLogger("awp.coordinator.leadership")

# What a lost or unreachable database looks like on this connection.
CONNECTION_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


class Leadership:
    def __init__(
        self,
        dsn: str,
        keepalive_s: float,
        application_name: str = "awp-coordinator-lock",
        key: int = LEADER_LOCK_KEY,
    ) -> None:
        self._dsn = dsn
        self._keepalive_s = keepalive_s
        self._application_name = application_name
        self._key = key
        self._conn: asyncpg.Connection | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._held = False
        self._unreachable = False
        self.lost_reason = ""

    @property
    def held(self) -> bool:
        return self._held

    def _timeout(self) -> float:
        # Long enough for a busy database, short enough that a dead one is noticed soon.
        return max(2.0, 2 * self._keepalive_s)

    async def try_acquire(self) -> bool:
        """One attempt. False while another session leads or the database is unreachable."""
        if self._held:
            return True
        try:
            async with asyncio.timeout(self._timeout()):
                if self._conn is None or self._conn.is_closed():
                    self._conn = await connect(self._dsn, application_name=self._application_name)
                    self._conn.add_termination_listener(self._on_terminated)
                acquired = await coordination.try_lead(self._conn, self._key)
        except CONNECTION_ERRORS as exc:
            # Once per outage, not once per attempt.
            if not self._unreachable:
                log.warning("cannot contend for leadership", extra={"error": repr(exc)})
            self._unreachable = True
            self._drop_connection()
            return False
        if self._unreachable:
            self._unreachable = False
            log.info("database reachable again")
        if acquired:
            self._held = True
            self.lost_reason = ""
            self._lost.clear()
            self._keepalive = asyncio.create_task(self._watch(), name="awp-leader-keepalive")
        return acquired

    async def wait_lost(self) -> None:
        await self._lost.wait()

    async def release(self) -> None:
        """Gives the lock back (a clean shutdown) and closes the connection."""
        await self._stop_keepalive()
        conn, self._conn = self._conn, None
        was_held, self._held = self._held, False
        if conn is None or conn.is_closed():
            return
        try:
            async with asyncio.timeout(self._timeout()):
                if was_held:
                    await coordination.resign(conn, self._key)
                await conn.close()
        except CONNECTION_ERRORS:
            # Closing the session releases the lock anyway.
            conn.terminate()

    def _on_terminated(self, _conn: Any) -> None:
        self._mark_lost("lock connection closed")

    def _mark_lost(self, why: str) -> None:
        if self._held:
            self._held = False
            self.lost_reason = why
            self._lost.set()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        while self._held:
            await asyncio.sleep(self._keepalive_s)
            conn = self._conn
            why = ""
            if conn is None:
                why = "lock connection gone"
            else:
                try:
                    async with asyncio.timeout(self._timeout()):
                        if not await coordination.still_leading(conn, self._key):
                            why = "lock no longer held by this session"
                except CONNECTION_ERRORS as exc:
                    why = f"keepalive failed: {exc!r}"
            if why:
                self._mark_lost(why)
                # Its state is unknown: a fresh connection contends again.
                self._keepalive = None
                self._drop_connection()
                return
