"""Running behind a connection pooler in transaction mode (docs/postgres.md).

There a pooled connection is not a session: every transaction may run on another
backend, so the limits AWP sets on each of its sessions (connect.SessionLimits) cannot
be set at all. The backends must carry them from their role; `check_limits` says, once at
start, which of them do not, and the statement that fixes each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from awp_db.connect import Pool, SessionLimits
from awp_db.queries import queries, rows_as

log = logging.getLogger("awp.db.pooler")

Q = queries("pooler")


@dataclass(frozen=True, slots=True)
class LooserLimit:
    """A setting the backends carry that is off, or looser than AWP's limit."""

    name: str
    setting: str
    fix: str


async def check_limits(pool: Pool, limits: SessionLimits) -> list[LooserLimit]:
    """The limits the pooler's backends do not enforce; logged as one warning (AWP still
    serves: fencing keeps every result correct, these limits bound how long one stalled
    process can hold the others up: docs/liveness.md)."""
    async with pool.acquire() as conn:
        waits = limits.waits(conn.get_server_version().major)
        looser = await rows_as(
            LooserLimit, conn, Q["looser_limits"], list(waits), [int(ms) for ms in waits.values()]
        )
    if looser:
        log.warning(
            "session limits not in force behind the transaction pooler: set them on the role",
            extra={
                "settings": ", ".join(f"{limit.name}={limit.setting}" for limit in looser),
                "fix": "; ".join(limit.fix for limit in looser),
            },
        )
    return looser
