"""Queue depth and fleet figures for operators (GetStats)."""

from __future__ import annotations

from dataclasses import dataclass, field

from awp_db import reads
from awp_db.connect import Pool
from awp_db.queries import queries

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
