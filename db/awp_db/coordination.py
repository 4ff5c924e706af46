"""The coordinator's transactions: cancel convergence, reaping, offline workers, retry
timers and the completion sweep (DESIGN.md §6, §7).

Each function is one short transaction on the connection it is given (a savepoint when
the caller already holds one). None relies on leadership: candidates are read without
locks, then every change re-checks its condition under the lock (awp_db.locks), so two
coordinators running the same pass at once settle each item exactly once. Given a
leader's term, the transaction writes only while that term holds
(awp_db.leadership.transaction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from awp_db import dispatching, leases, locks, settle, waits, workers
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.leadership import Term, transaction
from awp_db.queries import queries, row_as
from awp_kernel.retry import AttemptEnd
from awp_protocol.results import StoredError

Q = queries("coordination")

# Re-exported so the coordinator needs one storage module for its whole pass.
create_dispatches = dispatching.create_dispatches
withdraw_unservable = dispatching.withdraw_unservable
release_waits = waits.release_due
start_wait_tasks = waits.start_wait_tasks


@dataclass(frozen=True, slots=True)
class Reaped:
    interrupted: int = 0
    timed_out: int = 0
    settled: settle.Settled = field(default_factory=settle.Settled)
    # The leases settled (their attempts' spans: awp_db.traces).
    dispatch_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Offline:
    workers: list[UUID] = field(default_factory=list)
    leases: int = 0
    dispatch_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Due:
    """Which kinds of work have candidates now, and seconds until the next timer."""

    cancels: bool
    silent_workers: bool
    expired_leases: bool
    retries: bool
    unservable: bool
    ready: bool
    # Waits whose due time has come (awp_db.waits.release_due).
    waits: bool
    # Wait tasks ready to wait (awp_db.waits.start_wait_tasks).
    wait_tasks: bool
    starts: bool
    schedules: bool
    # Some kind's offers need topping up (grant.refill_due).
    short: bool
    next_due_in: float | None


# --- passes ----------------------------------------------------------------------------


async def due(conn: Conn, offline: workers.OfflineRule, prefetch: float) -> Due:
    """One unlocked read of what a pass has to do (each step re-checks under its locks)."""
    due = await row_as(Due, conn, Q["due"], offline.intervals, offline.floor_ms, prefetch)
    assert due is not None
    return due


async def converge_cancels(
    conn: Conn, limit: int = 100, *, term: Term | None = None
) -> dict[UUID, str]:
    """Stops every run whose cancellation was requested; returns {run: final state}.

    Live dispatches are canceled, running attempts and tasks `canceled`, untouched
    tasks `canceled`; the run takes the state its tasks imply (normally `canceled`).
    """
    candidates = [row["id"] for row in await conn.fetch(Q["cancel_requested"], limit)]
    if not candidates:
        return {}
    events = EventBatch()
    async with transaction(conn, term):
        locked = await locks.runs(conn, candidates)
        # Re-read under the lock: another coordinator may have converged it already.
        live = [run.id for run in locked if run.state == "running" and run.cancel_requested_at]
        if not live:
            return {}
        await settle.stop_runs(conn, live, "canceled", events)
        finished = await settle.finish_runs(conn, live, events)
        await events.flush(conn)
    return finished


async def reap_expired(conn: Conn, limit: int = 500, *, term: Term | None = None) -> Reaped:
    """Settles leases whose expiry or attempt deadline passed, with the retry rule."""
    candidates = await conn.fetch(Q["expired_leases"], limit)
    if not candidates:
        return Reaped()
    events = EventBatch()
    async with transaction(conn, term):
        await locks.runs(conn, {row["run_id"] for row in candidates})
        expired = await locks.expired_dispatches(conn, [row["id"] for row in candidates])
        # The same row-to-Ending mapping every other settlement path uses.
        endings = [
            settle.ending_of(
                row, row.ending, error=StoredError(_REAPED_BECAUSE[row.ending], retryable=True)
            )
            for row in expired
        ]
        settled = await settle.end_attempts(conn, endings, events)
        await events.flush(conn)
    timed_out = sum(1 for row in expired if row.ending == "timed_out")
    return Reaped(len(expired) - timed_out, timed_out, settled, tuple(row.id for row in expired))


_REAPED_BECAUSE: dict[AttemptEnd, str] = {
    "timed_out": "attempt deadline passed",
    "interrupted": "lease expired",
}


async def mark_silent_offline(
    conn: Conn, rule: workers.OfflineRule, *, term: Term | None = None
) -> Offline:
    """Workers silent for longer than the rule allows go `offline`; their leases are
    settled at once as `interrupted` (the retry rule decides what happens next)."""
    events = EventBatch()
    async with transaction(conn, term):
        # Session rows first (skipping any a heartbeat holds): awp_db.locks' order.
        silent = await locks.silent_sessions(conn, rule.intervals, rule.floor_ms)
        if not silent:
            return Offline()
        gone = await workers.mark_offline(conn, silent)
        held = await leases.worker_leases(conn, gone)
        interrupted = await leases.interrupt(
            conn, held, f"worker offline: no heartbeat for {rule.intervals} intervals", events
        )
        await events.flush(conn)
    return Offline(gone, interrupted, tuple(held))


async def release_retries(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Tasks whose retry backoff has passed: waiting_retry -> ready."""
    candidates = await conn.fetch(Q["due_retries"], limit)
    if not candidates:
        return 0
    events = EventBatch()
    async with transaction(conn, term):
        locked = await locks.runs(conn, {row["run_id"] for row in candidates})
        running = [run.id for run in locked if run.state == "running"]
        moved = await conn.fetch(Q["release_retries"], [row["id"] for row in candidates], running)
        for row in moved:
            events.task(row["run_id"], row["key"], "waiting_retry", "ready", row["attempts"])
        await events.flush(conn)
    return len(moved)


async def release_starts(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Delayed runs whose start time has come (database clock): roots pending -> ready."""
    candidates = [row["id"] for row in await conn.fetch(Q["due_starts"], limit)]
    if not candidates:
        return 0
    events = EventBatch()
    async with transaction(conn, term):
        await locks.runs(conn, candidates)
        moved = await conn.fetch(Q["release_starts"], candidates)
        for row in moved:
            events.task(row["run_id"], row["key"], "pending", "ready")
        await events.flush(conn)
    return len(moved)


async def sweep_finished(
    conn: Conn, limit: int = 1000, *, term: Term | None = None
) -> dict[UUID, str]:
    """Finishes running runs whose tasks are all terminal (a safety net: settlement
    already finishes runs in the transaction that ends their last task)."""
    candidates = [row["id"] for row in await conn.fetch(Q["finishable_runs"], limit)]
    if not candidates:
        return {}
    events = EventBatch()
    async with transaction(conn, term):
        await locks.runs(conn, candidates)
        finished = await settle.finish_runs(conn, candidates, events)
        await events.flush(conn)
    return finished
