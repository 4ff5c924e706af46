"""The grant rule: which ready tasks may be granted a lease now (docs/design.md §17).

This module is the one home of that decision. A ready task is granted by creating its
dispatch (ready -> queued), which then holds, until the lease it becomes ends, one
unit of: a slot of a worker that runs its executor kind, the global dispatch limit, its
run's concurrency, and each of its concurrency keys. `choose` is called only with the
dispatch lock held (dispatching.sql: serialise), so every count it reads is exact and
no two servers or coordinators can both spend the last unit. Both paths that grant
call it, through awp_db.dispatching: the coordinator's pass and a Claim whose slots find
no offer (which only tries the lock); there is no second copy of the rule.

Placement (docs/design.md §17): a task is granted only while an active worker of its
kind fits it (placement_fits: its required labels, each resource's capacity). Which
worker leases it, and whether that worker's resources are free, is decided at claim
(awp_db.placement), where the reservations are counted under the worker's session lock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from asyncpg import Record

from awp_db.connect import Conn
from awp_db.queries import queries
from awp_protocol.limits import MAX_PRIORITY, MIN_PRIORITY

Q = queries("grant")

# Aging: a ready task's priority rises one level per this much waiting, up to the highest
# base priority among the candidates; so a task of base priority p waits behind work of
# priority q > p for at most (q - p) steps before it goes first (docs/design.md §17).
# One constant, not a setting: every server and coordinator must rank alike.
AGING_STEP_MS = 1000
# Placement (docs/design.md §17): a dispatch that prefers a worker (sticky, or preferred
# labels) may be leased only by such a worker for this long after its grant, when one is
# active at the grant; after it, by any worker that meets its requirements.
PLACEMENT_FALLBACK_MS = 2000


@dataclass(frozen=True, slots=True)
class KindCapacity:
    """One executor kind's slots as dispatching.sql: capacity reads them."""

    kind: str
    free: int
    slots: int
    # Pending offers without placement requirements (those with some have their own
    # bound: `fit_room` in grant.sql).
    pending: int


@dataclass(frozen=True, slots=True)
class Grant:
    task_id: int
    run_id: UUID
    # The effective priority it was ranked at (base plus aging), kept on its dispatch.
    priority: int


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


def kind_budget(capacity: Sequence[KindCapacity], prefetch: float) -> dict[str, int]:
    """How many dispatches each kind may be offered now: its free slots plus the
    prefetch share of all its slots, less what is already pending."""
    budget: dict[str, int] = {}
    for row in capacity:
        if not refill_due(row.free, row.slots, row.pending, prefetch):
            continue
        room = row.free + math.ceil(prefetch * row.slots) - row.pending
        if room > 0:
            budget[row.kind] = room
    return budget


async def choose(conn: Conn, budget: dict[str, int], global_room: int | None) -> list[Grant]:
    """The ready tasks to grant now, in the order they should go: within each kind's
    budget, `global_room` more live dispatches (None: unbounded), every run's
    concurrency, every concurrency key's max and every rate limit's free units; higher
    effective priority first (aging included), then round-robin. The caller holds the
    dispatch lock.

    The query leaves out tasks a full key blocks and takes each first key's free units
    round-robin across keys; here every key of a task is counted, those granted in this
    pass included, so a task of several keys never takes a unit one of them lacks.
    """
    total = sum(budget.values())
    if global_room is not None:
        total = min(total, global_room)
    if total <= 0:
        return []
    left = dict(budget)
    taken: dict[str, int] = {}
    spent: dict[str, int] = {}
    # Offers granted this pass per placement requirement (see `fit_room`).
    placed: dict[tuple[object, ...], int] = {}
    chosen: list[Grant] = []
    rows = await conn.fetch(
        Q["candidates"], sorted(budget), total, AGING_STEP_MS, MIN_PRIORITY, MAX_PRIORITY
    )
    for row in rows:
        if len(chosen) >= total:
            break
        kind = row["executor_kind"]
        keys = list(zip(row["concurrency_keys"], row["concurrency_max"], row["held"], strict=True))
        if left.get(kind, 0) <= 0:
            continue
        rates = list(zip(row["rate_names"], row["rate_units"], row["rate_free"], strict=True))
        if any(taken.get(key, held) >= most for key, most, held in keys):
            continue
        if any(
            free is not None and spent.get(name, 0) + units > free for name, units, free in rates
        ):
            continue
        needs = _requirement(row)
        if needs is not None and placed.get(needs, 0) >= row["fit_room"]:
            continue
        if needs is not None:
            placed[needs] = placed.get(needs, 0) + 1
        left[kind] -= 1
        for key, _, held in keys:
            taken[key] = taken.get(key, held) + 1
        for name, units, _ in rates:
            spent[name] = spent.get(name, 0) + units
        chosen.append(Grant(row["id"], row["run_id"], row["priority"]))
    return chosen


def _requirement(row: Record) -> tuple[object, ...] | None:
    """A placed task's requirement (kind, labels, resources), None for one without: tasks
    of one requirement share the room of the workers that fit it. (Tasks of different
    requirements on the same workers each count that room: an over-offer the claims
    bound.)"""
    if row["fit_room"] is None:
        return None
    return (
        row["executor_kind"],
        tuple(row["required_labels"]),
        tuple(row["resource_names"]),
        tuple(row["resource_units"]),
    )


async def explain(conn: Conn, run_id: UUID) -> dict[str, str]:
    """Why each ready task of the run is not granted now (by task key; only those held
    back by a limit, by higher-priority work, or by no worker of their kind, labels or
    resources): the same counts as `choose`; and why a queued task's placed offer is not
    leased yet (its resources reserved on every worker that could run it, or its
    preferred worker's turn)."""
    rows = await conn.fetch(Q["explain"], run_id, AGING_STEP_MS, MIN_PRIORITY, MAX_PRIORITY)
    return {row["key"]: row["why"] for row in rows if row["why"]}
