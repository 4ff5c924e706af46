"""Contending for, keeping and giving back the leader lease (awp_db.leadership,
docs/leadership.md).

A standby tries for the lease when the current one is due to expire (and at least once
per renewal interval, so a released lease is taken soon). The leader renews it three
times per lease length, from a task of its own, so that passes, however long or far
apart, never let it lapse while the process runs and reaches the database. What a
renewal cannot prove (that a pass about to write still leads) every leader transaction
checks itself (awp_db.leadership.transaction). The leader steps down as soon as the
database says its term is over, or once it could not renew for a whole lease length.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

import asyncpg

from awp_db import leadership
from awp_db.connect import Pool
from awp_db.leadership import Term

log = logging.getLogger("awp.coordinator.leadership")

# What a lost or unreachable database looks like.
CONNECTION_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
# Renewals per lease length: one late renewal (a slow database, a busy machine) never
# loses the lease.
RENEWALS_PER_TTL: Final = 3
# A standby tries just after the lease it saw expires (the database checks expiry
# strictly against its own clock), never more often than this.
RETRY_MARGIN_S: Final = 0.005
MIN_RETRY_S: Final = 0.01


class Leadership:
    def __init__(
        self, pool: Pool, holder: str, ttl_s: float, global_dispatch_limit: int = 0
    ) -> None:
        self._pool = pool
        self._holder = holder
        self._global_dispatch_limit = global_dispatch_limit
        self._ttl_s = ttl_s
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self.renew_every_s = ttl_s / RENEWALS_PER_TTL
        # Long enough for a busy database (and for an acquire that waits out a stalled
        # leader's transaction, ended after ttl), short enough to notice a dead one.
        self._timeout_s = max(2.0, 2 * ttl_s)
        self.term: Term | None = None
        # Who held the lease before this process took it ('' if nobody ever led).
        self.previous_holder = ""
        # Seconds until another try is worth it, after a try that did not win.
        self.retry_in = self.renew_every_s
        self.lost_reason = ""
        self._lost = asyncio.Event()
        self._renewing: asyncio.Task[None] | None = None
        self._renewed_at = 0.0
        self._unreachable = False

    async def try_acquire(self) -> bool:
        """One try. False while another coordinator leads or the database is unreachable."""
        if self.term is not None:
            return True
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout_s):
                attempt = await leadership.acquire(
                    self._pool, self._holder, self._ttl_ms, self._global_dispatch_limit
                )
        except CONNECTION_ERRORS as exc:
            # Once per outage, not once per try.
            if not self._unreachable:
                log.warning("cannot contend for leadership", extra={"error": repr(exc)})
            self._unreachable = True
            self.retry_in = self.renew_every_s
            return False
        if self._unreachable:
            self._unreachable = False
            log.info("database reachable again")
        if attempt.epoch is None:
            self.retry_in = min(
                self.renew_every_s, max(attempt.expires_in + RETRY_MARGIN_S, MIN_RETRY_S)
            )
            return False
        self.term = Term(self._holder, attempt.epoch, self._ttl_ms)
        self.previous_holder = attempt.holder
        self.lost_reason = ""
        self._lost.clear()
        self._renewed_at = started
        self._renewing = asyncio.create_task(self._renew(), name="awp-leader-renewal")
        return True

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def lose(self, why: str) -> None:
        """Steps down: the term is over (or cannot be shown to hold any more)."""
        if self.term is None:
            return
        self.term = None
        self.lost_reason = why
        self._lost.set()
        task, self._renewing = self._renewing, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def release(self) -> None:
        """A clean stop: ends the lease now, so a standby need not wait for it to expire."""
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        term, self.term = self.term, None
        if term is None:
            return
        # Unreachable: the lease simply expires unrenewed.
        with contextlib.suppress(*CONNECTION_ERRORS):
            async with asyncio.timeout(self._timeout_s):
                await leadership.resign(self._pool, term)

    async def _renew(self) -> None:
        while (term := self.term) is not None:
            await asyncio.sleep(self.renew_every_s)
            started = time.monotonic()
            try:
                async with asyncio.timeout(self._timeout_s):
                    renewed = await leadership.renew(self._pool, term)
            except CONNECTION_ERRORS as exc:
                # The lease may have lapsed (and been taken) meanwhile: by this process's
                # clock it has, once a whole lease length passed since the last renewal
                # was sent. Stepping down then is at worst early; contending again is safe.
                if started - self._renewed_at >= self._ttl_s:
                    self.lose(f"lease not renewed for {self._ttl_s:g} s: {exc!r}")
                continue
            if not renewed:
                self.lose(f"superseded: epoch {term.epoch} is no longer the leader's")
                return
            self._renewed_at = started
