"""Leases revoked under their holder: the notifications of migration 0012's trigger,
and the database's word on them.

The notification says only where to look; `confirmed` reads the dispatches again, so a
forged or stale payload can make a server look, never answer REVOKED wrongly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from awp_db.connect import Conn
from awp_db.queries import queries

Q = queries("revocations")


@dataclass(frozen=True, slots=True)
class Revoked:
    """A dispatch that `worker_id` held and that is no longer leased."""

    worker_id: UUID
    dispatch_id: int


def parse(payload: str) -> Revoked | None:
    """The (worker, dispatch) of a LEASE_REVOKED_CHANNEL payload; None if malformed."""
    worker, _, dispatch = payload.partition(":")
    try:
        return Revoked(uuid.UUID(worker), int(dispatch))
    except ValueError:
        return None


async def confirmed(conn: Conn, candidates: Iterable[Revoked]) -> list[Revoked]:
    """The candidates whose dispatch the worker held and that is no longer leased."""
    pairs: Sequence[Revoked] = list(candidates)
    if not pairs:
        return []
    rows = await conn.fetch(
        Q["revoked"], [p.worker_id for p in pairs], [p.dispatch_id for p in pairs]
    )
    return [Revoked(row["worker_id"], row["dispatch_id"]) for row in rows]
