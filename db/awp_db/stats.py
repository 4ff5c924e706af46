"""Queue depth and fleet figures for operators: GetStats, and the coordinator's gauges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

import asyncpg

from awp_db import ratelimits, reads
from awp_db.connect import Conn, Pool
from awp_db.queries import queries, rows_as

Q = queries("stats")


@dataclass(frozen=True, slots=True)
class StateCount:
    state: str
    executor_kind: str | None
    count: int


@dataclass(frozen=True, slots=True)
class Stats:
    # Tasks of running runs, by state and executor kind.
    tasks: list[StateCount] = field(default_factory=list)
    # Pending and leased dispatches, by state and executor kind.
    dispatches: list[StateCount] = field(default_factory=list)
    runs: list[StateCount] = field(default_factory=list)
    workers: list[StateCount] = field(default_factory=list)
    oldest_pending_ms: float | None = None

    @property
    def active_leases(self) -> int:
        return sum(c.count for c in self.dispatches if c.state == "leased")


async def snapshot(pool: Pool) -> Stats:
    sections: dict[str, list[StateCount]] = {
        "tasks": [],
        "dispatches": [],
        "runs": [],
        "workers": [],
    }
    # One snapshot, so the figures add up (e.g. leased dispatches vs running tasks).
    async with reads.snapshot(pool) as conn:
        for row in await conn.fetch(Q["counts"]):
            sections[row["section"]].append(
                StateCount(row["state"], row["executor_kind"], row["n"])
            )
        oldest_pending_ms = await conn.fetchval(Q["oldest_pending"])
    return Stats(**sections, oldest_pending_ms=oldest_pending_ms)


@dataclass(frozen=True, slots=True)
class Count:
    state: str
    # The executor kind or the workflow name, as the section says (sql/stats.sql gauges).
    label: str | None
    count: int


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """One live worker's resource: its capacity and the units its leases reserve."""

    worker_id: UUID
    worker_name: str
    resource: str
    capacity: int
    reserved: int


# LimitWaiting's kinds (also the metrics' `kind` label).
KEY: Final = "key"
RATE: Final = "rate"


@dataclass(frozen=True, slots=True)
class LimitWaiting:
    """Ready tasks a limit holds back now: kind KEY (a concurrency key) or RATE."""

    kind: str
    name: str
    waiting: int


@dataclass(frozen=True, slots=True)
class Gauges:
    """What the leader coordinator exports as gauges, read in one snapshot."""

    # Pending and leased dispatches, label = executor kind.
    dispatches: list[Count] = field(default_factory=list)
    # Ready tasks not yet offered to a worker, label = executor kind.
    ready_tasks: list[Count] = field(default_factory=list)
    # The same by base priority (run's plus task's), label = the priority.
    ready_by_priority: list[Count] = field(default_factory=list)
    # Active and draining worker sessions.
    workers: list[Count] = field(default_factory=list)
    # The executor kinds live workers serve, label = kind (count 0).
    served_kinds: list[Count] = field(default_factory=list)
    running_runs: list[Count] = field(default_factory=list)
    # Runs finished within the window, state = outcome, label = workflow name.
    finished_runs: list[Count] = field(default_factory=list)
    oldest_pending_ms: float | None = None
    # Flow control: every rate limit with its use now, and concurrency units held (live
    # dispatches holding a key) and the distinct keys they hold.
    rate_limits: list[ratelimits.RateLimitRow] = field(default_factory=list)
    units_held: int = 0
    keys_held: int = 0
    # Placement: every live worker's resources.
    resources: list[ResourceUse] = field(default_factory=list)
    # Every limit holding back a ready task now.
    held_back: list[LimitWaiting] = field(default_factory=list)


async def gauges(pool: Pool, window_s: float) -> Gauges:
    sections: dict[str, list[Count]] = {
        "dispatches": [],
        "ready_tasks": [],
        "ready_by_priority": [],
        "workers": [],
        "served_kinds": [],
        "running_runs": [],
        "finished_runs": [],
    }
    async with reads.snapshot(pool) as conn:
        for row in await conn.fetch(Q["gauges"], window_s):
            sections[row["section"]].append(Count(row["state"], row["label"], row["n"]))
        oldest_pending_ms = await conn.fetchval(Q["oldest_pending"])
        limits = await ratelimits.list_all(conn)
        held = await conn.fetchrow(Q["units_held"])
        assert held is not None  # an aggregate answers one row
        resources = await rows_as(ResourceUse, conn, Q["resources"])
        held_back = await limits_waiting(conn, limits)
    return Gauges(
        **sections,
        oldest_pending_ms=oldest_pending_ms,
        rate_limits=limits,
        units_held=held["units"],
        keys_held=held["keys"],
        resources=resources,
        held_back=held_back,
    )


async def limits_waiting(conn: Conn, limits: list[ratelimits.RateLimitRow]) -> list[LimitWaiting]:
    """Every limit holding back a ready task now: concurrency keys, then rate limits by
    name. `limits` is ratelimits.list_all read on `conn`, in the same snapshot (the
    coordinator's gauges and ListRateLimits both count this way)."""
    keys = await conn.fetch(Q["keys_waiting"])
    uses = await conn.fetch(Q["rate_uses_ready"])
    keys_waiting = [LimitWaiting(KEY, row["name"], row["waiting"]) for row in keys]
    return keys_waiting + _rates_waiting(limits, uses)


def _rates_waiting(
    limits: list[ratelimits.RateLimitRow], uses: list[asyncpg.Record]
) -> list[LimitWaiting]:
    """The ready tasks each rate limit holds back: all of them while it is paused, else
    those needing more units than it has free in the window ending now (the grant's
    test, grant.sql: candidates)."""
    by_name = {limit.name: limit for limit in limits}
    waiting: dict[str, int] = {}
    for use in uses:
        limit = by_name.get(use["name"])
        if limit is not None and (limit.paused or use["units"] > limit.units - limit.used):
            waiting[limit.name] = waiting.get(limit.name, 0) + use["tasks"]
    return [LimitWaiting(RATE, name, count) for name, count in sorted(waiting.items())]
