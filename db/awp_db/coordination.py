"""The coordinator's transactions: cancel convergence, reaping, offline workers, retry
timers, the completion sweep and leadership (DESIGN.md §6, §7).

Each function is one short transaction on the connection it is given (a savepoint when
the caller already holds one). None relies on the leader lock: candidates are read
without locks, then every change re-checks its condition under the lock, so two
coordinators running the same pass at once settle each item exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

from awp_db import dispatching, leases, settle, workers
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.queries import queries

Q = queries("coordination")

# The leader lock: an arbitrary constant beside the migration lock (0x415750_0001).
LEADER_LOCK_KEY: Final = 0x415750_0002

# Re-exported so the coordinator needs one storage module for its whole pass.
create_dispatches = dispatching.create_dispatches
withdraw_unservable = dispatching.withdraw_unservable


@dataclass(slots=True)
class Reaped:
    interrupted: int = 0
    timed_out: int = 0
    settled: settle.Settled = field(default_factory=settle.Settled)


@dataclass(slots=True)
class Offline:
    workers: list[UUID] = field(default_factory=list)
    leases: int = 0


@dataclass(frozen=True, slots=True)
class Due:
    """Which kinds of work have candidates now, and seconds until the next timer."""

    cancels: bool
    silent_workers: bool
    expired_leases: bool
    retries: bool
    unservable: bool
    ready: bool
    # Some kind's offers need topping up (dispatching.refill_due).
    short: bool
    next_due_in: float | None


# --- leadership (a session lock: only on a dedicated, never pooled, connection) ----------


async def try_lead(conn: Conn, key: int = LEADER_LOCK_KEY) -> bool:
    acquired: bool = await conn.fetchval(Q["try_lead"], key)
    return acquired


async def still_leading(conn: Conn, key: int = LEADER_LOCK_KEY) -> bool:
    held: bool = await conn.fetchval(Q["still_leading"], key)
    return held


async def resign(conn: Conn, key: int = LEADER_LOCK_KEY) -> bool:
    released: bool = await conn.fetchval(Q["resign"], key)
    return released


async def leader(conn: Conn, key: int = LEADER_LOCK_KEY) -> tuple[int, str] | None:
    """(backend pid, application name) of the session holding the leader lock."""
    row = await conn.fetchrow(Q["leader_pid"], key)
    return None if row is None else (row["pid"], row["application_name"])


# --- passes ----------------------------------------------------------------------------


async def due(conn: Conn, offline: workers.OfflineRule, prefetch: float) -> Due:
    """One unlocked read of what a pass has to do (each step re-checks under its locks)."""
    row = await conn.fetchrow(Q["due"], offline.intervals, offline.floor_ms, prefetch)
    assert row is not None
    return Due(
        cancels=row["cancels"],
        silent_workers=row["silent_workers"],
        expired_leases=row["expired_leases"],
        retries=row["retries"],
        unservable=row["unservable"],
        ready=row["ready"],
        short=row["short"],
        next_due_in=row["next_due_in"],
    )


async def converge_cancels(conn: Conn, limit: int = 100) -> dict[UUID, str]:
    """Stops every run whose cancellation was requested; returns {run: final state}.

    Live dispatches are canceled, running attempts and tasks `canceled`, untouched
    tasks `canceled`; the run takes the state its tasks imply (normally `canceled`).
    """
    candidates = [row["id"] for row in await conn.fetch(Q["cancel_requested"], limit)]
    if not candidates:
        return {}
    events = EventBatch()
    async with conn.transaction():
        locked = await settle.lock_runs(conn, candidates)
        # Re-read under the lock: another coordinator may have converged it already.
        live = [
            row["id"]
            for row in locked
            if row["state"] == "running" and row["cancel_requested_at"] is not None
        ]
        if not live:
            return {}
        await settle.stop_runs(conn, live, "canceled", events)
        finished = await settle.finish_runs(conn, live, events)
        await events.flush(conn)
    return finished


async def reap_expired(conn: Conn, limit: int = 500) -> Reaped:
    """Settles leases whose expiry or attempt deadline passed, with the retry rule."""
    reaped = Reaped()
    candidates = await conn.fetch(Q["expired_leases"], limit)
    if not candidates:
        return reaped
    events = EventBatch()
    async with conn.transaction():
        await settle.lock_runs(conn, {row["run_id"] for row in candidates})
        rows = await conn.fetch(Q["lock_expired"], [row["id"] for row in candidates])
        endings = []
        for row in rows:
            if row["ending"] == "timed_out":
                reaped.timed_out += 1
                message = "attempt deadline passed"
            else:
                reaped.interrupted += 1
                message = "lease expired"
            # The same row-to-Ending mapping every other settlement path uses.
            endings.append(
                settle.ending_of(row, row["ending"], error={"message": message, "retryable": True})
            )
        reaped.settled = await settle.end_attempts(conn, endings, events)
        await events.flush(conn)
    return reaped


async def mark_silent_offline(conn: Conn, rule: workers.OfflineRule) -> Offline:
    """Workers silent for longer than the rule allows go `offline`; their leases are
    settled at once as `interrupted` (the retry rule decides what happens next)."""
    offline = Offline()
    events = EventBatch()
    async with conn.transaction():
        # Worker rows first (skipping any a heartbeat holds), then runs, then dispatches:
        # the order Claim and Drain use.
        silent = await workers.lock_silent(conn, rule)
        if not silent:
            return offline
        offline.workers = await workers.mark_offline(conn, silent)
        held = await leases.worker_leases(conn, offline.workers)
        offline.leases = await leases.interrupt(
            conn, held, f"worker offline: no heartbeat for {rule.intervals} intervals", events
        )
        await events.flush(conn)
    return offline


async def release_retries(conn: Conn, limit: int = 1000) -> int:
    """Tasks whose retry backoff has passed: waiting_retry -> ready."""
    candidates = await conn.fetch(Q["due_retries"], limit)
    if not candidates:
        return 0
    events = EventBatch()
    async with conn.transaction():
        locked = await settle.lock_runs(conn, {row["run_id"] for row in candidates})
        running = [row["id"] for row in locked if row["state"] == "running"]
        moved = await conn.fetch(Q["release_retries"], [row["id"] for row in candidates], running)
        for row in moved:
            events.task(row["run_id"], row["key"], "waiting_retry", "ready", row["attempts"])
        await events.flush(conn)
    return len(moved)


async def sweep_finished(conn: Conn, limit: int = 1000) -> dict[UUID, str]:
    """Finishes running runs whose tasks are all terminal (a safety net: settlement
    already finishes runs in the transaction that ends their last task)."""
    candidates = [row["id"] for row in await conn.fetch(Q["finishable_runs"], limit)]
    if not candidates:
        return {}
    events = EventBatch()
    async with conn.transaction():
        await settle.lock_runs(conn, candidates)
        finished = await settle.finish_runs(conn, candidates, events)
        await events.flush(conn)
    return finished
