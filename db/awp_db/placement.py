"""Placement at claim: which placed dispatches each claiming worker leases (docs/design.md
§17, migration 0020).

A dispatch with required labels, resources or a preferred worker is leased only to a
worker that meets it (the SQL functions placement_fits and placement_prefers are the
rule's one home). Resources are held by the lease: a worker's reserved units are the sum
over its leased dispatches, read under its session row lock, which every claim of that
worker takes first (awp_db.claims), so the count is exact and nothing needs giving back
when a lease ends. Several dispatches of one claim are counted together here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar
from uuid import UUID

from awp_db.connect import Conn
from awp_db.queries import queries, rows_as

Q = queries("placement")

# The placed dispatches one claim weighs at most per slot it offers: enough to find the
# ones a worker fits among those of the locked runs, bounded so a claim stays cheap.
CANDIDATES_PER_SLOT = 16


class Claimer(Protocol):
    """A call of the claim batch (awp_db.claims._Claimer)."""

    @property
    def worker_id(self) -> UUID: ...

    @property
    def missing(self) -> int: ...

    @property
    def capacity(self) -> dict[str, int]: ...


C = TypeVar("C", bound=Claimer)


@dataclass(frozen=True, slots=True)
class _Placeable:
    id: int
    worker_id: UUID
    resource_names: list[str]
    resource_units: list[int]


@dataclass(frozen=True, slots=True)
class _Reserved:
    worker_id: UUID
    name: str
    units: int


async def match(
    conn: Conn, group: Sequence[C], kinds: Sequence[str], run_ids: Sequence[UUID]
) -> list[tuple[C, int]]:
    """(claimer, dispatch id) pairs to lease: each claimer, in order, takes the oldest
    placed dispatches it may run whose resources fit what its worker has free, up to
    its missing slots. The session rows and the runs are locked by the caller."""
    workers = sorted({claimer.worker_id for claimer in group})
    limit = CANDIDATES_PER_SLOT * sum(claimer.missing for claimer in group)
    rows = await rows_as(
        _Placeable, conn, Q["placeable"], list(run_ids), list(kinds), workers, limit
    )
    if not rows:
        return []
    free = {claimer.worker_id: dict(claimer.capacity) for claimer in group}
    if any(row.resource_names for row in rows):
        for held in await rows_as(_Reserved, conn, Q["reserved"], workers):
            free[held.worker_id][held.name] = free[held.worker_id].get(held.name, 0) - held.units
    taken: set[int] = set()
    chosen: list[tuple[C, int]] = []
    for claimer in group:
        room = claimer.missing
        own = free[claimer.worker_id]
        for row in rows:
            if room == 0:
                break
            if row.worker_id != claimer.worker_id or row.id in taken:
                continue
            needs = list(zip(row.resource_names, row.resource_units, strict=True))
            if any(own.get(name, 0) < units for name, units in needs):
                continue
            for name, units in needs:
                own[name] -= units
            taken.add(row.id)
            chosen.append((claimer, row.id))
            room -= 1
    return chosen
