"""Creating dispatches for what the grant rule (awp_db.grant) allows, and withdrawing
unservable ones."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

from awp_db import grant, locks
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.leadership import Term, transaction
from awp_db.queries import queries
from awp_db.signals import DISPATCH_CHANNEL, DISPATCH_LOCK_KEY

Q = queries("dispatching")
# Why an offer was withdrawn (the queued -> ready event's payload).
UNSERVABLE = "no active worker can run it (its executor kind, required labels and resources)"

log = logging.getLogger("awp.db.dispatching")


@dataclass(frozen=True, slots=True)
class DispatchPass:
    created: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    # Runs whose tasks were chosen but which were busy (locked): left to the next pass.
    skipped_runs: int = 0
    # The runs dispatches were created in (locked by this transaction), each with whether
    # one of them has placement to match (a Claim leases them at once: awp_db.claims).
    runs: tuple[locks.ClaimableRun, ...] = ()


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
    (`grant.refill_due`), so each dispatch transaction (which takes the run locks that claims
    and results need too) creates a larger batch, less often, while claims made during
    the refill still find full offers. Every limit above still holds: the extra offers
    count against the run's concurrency and the global limit, and a claim never exceeds
    a worker's free slots.
    """
    events = EventBatch()
    async with transaction(conn, term):
        await conn.execute(Q["serialise"], DISPATCH_LOCK_KEY)
        rows = await conn.fetch(Q["capacity"])
        budget = grant.kind_budget(
            [grant.KindCapacity(r["kind"], r["free"], r["slots"], r["open_pending"]) for r in rows],
            prefetch,
        )
        done = await _grant(conn, budget, _room(rows, global_limit), events, term, claim=False)
        await events.flush(conn)
    return done


async def serialise_for_claims(conn: Conn) -> None:
    """A Claim's transaction starts here: when some task is ready and no offer is left,
    it waits for the dispatch lock first, holding nothing (in the lock order), so that a
    pass granting the same tasks is followed, not raced, and grant_for_claims then
    holds it already. (Both wake on the same notification; the pass, with less to do
    before the lock, usually won, and the Claim found the lock taken and no offer yet.)"""
    await conn.execute(Q["serialise_if_bare"], DISPATCH_LOCK_KEY)


async def grant_for_claims(
    conn: Conn, missing: dict[str, int], slots: int, events: EventBatch
) -> DispatchPass:
    """Grants, inside a Claim's transaction, up to `missing[kind]` ready tasks of each
    kind its short claimers run and `slots` in all, through the same rule and counts as
    the coordinator's pass (docs/design.md §17 "Granting where the worker waits"): what
    was created, and in which runs (which this transaction then holds).

    The Claim already holds its sessions' rows (and some runs), which come after the
    dispatch lock in the lock order, so unless serialise_for_claims took it it only
    tries that lock: when a pass (or another Claim) holds it, it grants nothing and the
    pass's dispatches wake it instead. The
    runs it creates dispatches for are taken SKIP LOCKED; events go to the Claim's batch.
    The global limit is the leading coordinator's (published with its term). Nothing
    is announced on DISPATCH_CHANNEL: the Claim leases what it granted at once, and
    waking every parked Claim for it would only have them find nothing.
    """
    tried = await conn.fetchrow(Q["try_serialise"], DISPATCH_LOCK_KEY, sorted(missing))
    if tried is None or not tried["locked"]:
        return DispatchPass()
    room = slots
    if tried["global_limit"] > 0:  # the capacity read counts only for a global limit
        left = _room(await conn.fetch(Q["capacity"]), tried["global_limit"])
        room = slots if left is None else min(left, slots)
    return await _grant(conn, missing, room, events, None, claim=True)


def _room(capacity: Sequence[asyncpg.Record], global_limit: int) -> int | None:
    """How many more live dispatches the global limit allows (None: unbounded)."""
    if global_limit <= 0:
        return None
    # Pending + leased, all kinds (no row: no active worker and nothing pending).
    in_flight: int = (capacity[0]["leased"] if capacity else 0) + sum(
        r["pending"] for r in capacity
    )
    return global_limit - in_flight


async def _grant(
    conn: Conn,
    budget: dict[str, int],
    global_room: int | None,
    events: EventBatch,
    term: Term | None,
    *,
    claim: bool,
) -> DispatchPass:
    """Creates the dispatches grant.choose allows, under the dispatch lock the caller
    holds. A coordinator's pass (holding nothing after that lock) may wait for busy runs
    and announces its dispatches; a Claim (holding its sessions) skips busy runs and
    leases what it creates itself."""
    chosen = await grant.choose(conn, budget, global_room)
    if not chosen:
        return DispatchPass()
    # Runs busy with claims and results are left to the next pass (which follows at
    # once, and serves the least recently dispatched runs first): waiting for them
    # while holding the others would stall those too. Only when every run is busy
    # does the pass wait.
    run_ids = {g.run_id for g in chosen}
    locked = {run.id for run in await locks.free_runs(conn, run_ids)}
    if not locked and not claim:
        locked = {run.id for run in await locks.runs(conn, run_ids)}
    by_kind: Counter[str] = Counter()
    placed: dict[UUID, bool] = {}
    granted = [g for g in chosen if g.run_id in locked]
    rows = await conn.fetch(
        Q["create"],
        [g.task_id for g in granted],
        [g.priority for g in granted],
        grant.PLACEMENT_FALLBACK_MS,
    )
    for row in rows:
        events.task(
            row["run_id"],
            row["key"],
            "ready",
            "queued",
            payload=_dispatched(row["dispatch_id"], term),
        )
        by_kind[row["executor_kind"]] += 1
        placed[row["run_id"]] = placed.get(row["run_id"], False) or row["placed"]
    # Servers parking long-poll claims hear which kinds have new work.
    for kind in sorted(by_kind) if not claim else ():
        events.notify(DISPATCH_CHANNEL, kind)
    runs = tuple(locks.ClaimableRun(run_id, placed[run_id]) for run_id in sorted(placed))
    return DispatchPass(by_kind.total(), by_kind, len(run_ids - locked), runs)


def _dispatched(dispatch_id: int, term: Term | None) -> dict[str, int]:
    """The payload of a task's ready -> queued event: its dispatch, and the leader epoch
    that created it (an audit trail: no dispatch is ever created under a superseded one)."""
    if term is None:
        return {"dispatch_id": dispatch_id}
    return {"dispatch_id": dispatch_id, "leader_epoch": term.epoch}


async def withdraw_unservable(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Queued tasks no active worker could run (its kind, required labels and resources:
    the grant's own rule) go back to ready, nothing spent; grant.explain says why."""
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
                payload={"why": UNSERVABLE},
            )
        await events.flush(conn)
    return len(moved)
