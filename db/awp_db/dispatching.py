"""Creating dispatches within the limits (DESIGN.md §7), and withdrawing unservable ones."""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

from awp_db import locks
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.leadership import Term, transaction
from awp_db.queries import queries
from awp_db.signals import DISPATCH_CHANNEL, DISPATCH_LOCK_KEY

Q = queries("dispatching")
log = logging.getLogger("awp.db.dispatching")


@dataclass(frozen=True, slots=True)
class DispatchPass:
    created: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    # Runs whose tasks were chosen but which were busy (locked): left to the next pass.
    skipped_runs: int = 0


async def create_dispatches(
    conn: Conn, global_limit: int = 0, prefetch: float = 0.0, *, term: Term | None = None
) -> DispatchPass:
    """One set-based pass: dispatches for ready tasks while compatible workers have room.

    global_limit bounds pending + leased dispatches (0: unbounded). Per-worker
    max_concurrency is enforced again at claim; this only avoids over-offering.

    prefetch keeps up to that fraction of the compatible active workers' slots offered
    beyond their free slots (0: exactly the free slots), so a worker whose slots free
    finds its next leases waiting instead of waiting for the next pass. The offers are
    topped up only once less than half of that prefetch is left beyond the free slots
    (`refill_due`), so each dispatch transaction (which takes the run locks that claims
    and results need too) creates a larger batch, less often, while claims made during
    the refill still find full offers. Every limit above still holds: the extra offers
    count against the run's concurrency and the global limit, and a claim never exceeds
    a worker's free slots.
    """
    events = EventBatch()
    async with transaction(conn, term):
        await conn.execute(Q["serialise"], DISPATCH_LOCK_KEY)
        budget: dict[str, int] = {}
        rows = await conn.fetch(Q["capacity"])
        # Pending + leased, all kinds (no row: no active worker and nothing pending).
        in_flight = (rows[0]["leased"] if rows else 0) + sum(row["pending"] for row in rows)
        for row in rows:
            if not refill_due(row["free"], row["slots"], row["pending"], prefetch):
                continue
            room = row["free"] + math.ceil(prefetch * row["slots"]) - row["pending"]
            if room > 0:
                budget[row["kind"]] = room
        total = sum(budget.values())
        if global_limit > 0:
            total = min(total, global_limit - in_flight)
        if total <= 0 or not budget:
            return DispatchPass()
        chosen: list[tuple[int, UUID]] = []
        for row in await conn.fetch(Q["candidates"], sorted(budget), total):
            if len(chosen) >= total:
                break
            kind = row["executor_kind"]
            if budget.get(kind, 0) > 0:
                budget[kind] -= 1
                chosen.append((row["id"], row["run_id"]))
        if not chosen:
            return DispatchPass()
        # Runs busy with claims and results are left to the next pass (which follows at
        # once, and serves the least recently dispatched runs first): waiting for them
        # while holding the others would stall those too. Only when every run is busy
        # does the pass wait.
        run_ids = {run_id for _, run_id in chosen}
        locked = {run.id for run in await locks.free_runs(conn, run_ids)}
        if not locked:
            locked = {run.id for run in await locks.runs(conn, run_ids)}
        by_kind: Counter[str] = Counter()
        for row in await conn.fetch(
            Q["create"], [task for task, run_id in chosen if run_id in locked]
        ):
            events.task(
                row["run_id"],
                row["key"],
                "ready",
                "queued",
                payload=_dispatched(row["dispatch_id"], term),
            )
            by_kind[row["executor_kind"]] += 1
        # Servers parking long-poll claims hear which kinds have new work.
        for kind in sorted(by_kind):
            events.notify(DISPATCH_CHANNEL, kind)
        await events.flush(conn)
    return DispatchPass(by_kind.total(), by_kind, len(run_ids - locked))


def _dispatched(dispatch_id: int, term: Term | None) -> dict[str, int]:
    """The payload of a task's ready -> queued event: its dispatch, and the leader epoch
    that created it (an audit trail: no dispatch is ever created under a superseded one)."""
    if term is None:
        return {"dispatch_id": dispatch_id}
    return {"dispatch_id": dispatch_id, "leader_epoch": term.epoch}


def refill_due(free: int, slots: int, pending: int, prefetch: float) -> bool:
    """Whether a kind's offers need topping up: fewer pending dispatches than its free
    slots plus half the prefetch. (The `due` query computes the same condition.)

    Refilling only once the offers no longer covered the free slots left the claims
    that arrived while the refill was under way with partial leases: a worker then
    claims the rest separately and its slots stay split into several smaller claims and
    completes for the rest of the run (measured with ten concurrent runs: 0.21 claims
    per task instead of 0.125; with the half-prefetch mark 0.14).
    """
    return pending < free + math.ceil(prefetch * slots / 2)


async def withdraw_unservable(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Queued tasks whose kind no active worker runs go back to ready, nothing spent."""
    events = EventBatch()
    async with transaction(conn, term):
        rows = await conn.fetch(Q["unservable"], limit)
        if not rows:
            return 0
        await locks.runs(conn, {row["run_id"] for row in rows})
        moved = await conn.fetch(Q["withdraw"], [row["id"] for row in rows])
        for row in moved:
            events.task(
                row["run_id"],
                row["key"],
                "queued",
                "ready",
                payload={"why": "no active worker runs this executor kind"},
            )
        await events.flush(conn)
    return len(moved)
