"""Rate limits and token budgets: named limits of units per period, set at run time;
what each grant charged them and what the attempts reported (docs/design.md §17).

The grant rule itself (awp_db.grant) reads them; this module sets and reads them, and
applies what an accepted Complete reports: the actual usage replacing the estimate, and
a provider's "slow down" pausing the limit for everyone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from awp_db import locks
from awp_db.connect import Conn, Pool
from awp_db.queries import queries, rows_as
from awp_db.signals import DISPATCH_LOCK_KEY
from awp_kernel.errors import not_found
from awp_protocol.errors import Reason, quote
from awp_protocol.results import CheckedResult

Q = queries("ratelimits")
log = logging.getLogger("awp.db.ratelimits")


@dataclass(frozen=True, slots=True)
class RateLimitRow:
    name: str
    units: int
    period_ms: int
    paused_until: datetime | None
    updated_at: datetime
    updated_by: str
    used: int
    paused: bool | None


async def set_limit(conn: Conn, name: str, units: int, period_ms: int, by: str) -> RateLimitRow:
    """Creates or changes the limit; the next grant uses it."""
    async with conn.transaction():
        # The dispatch lock (dispatching.sql: serialise): no grant is between its count
        # and its charge while the budget changes.
        await conn.execute(queries("dispatching")["serialise"], DISPATCH_LOCK_KEY)
        await locks.rate_limits(conn, [name])
        await conn.fetchval(Q["set"], name, units, period_ms, by)
    log.info("rate limit set", extra={"limit": name, "units": units, "period_ms": period_ms})
    return await get(conn, name)


async def get(conn: Conn | Pool, name: str) -> RateLimitRow:
    rows = await rows_as(RateLimitRow, conn, Q["read"], name)
    if not rows:
        raise not_found(Reason.RATE_LIMIT_NOT_FOUND, f"rate limit {quote(name)}")
    return rows[0]


async def list_all(conn: Conn | Pool) -> list[RateLimitRow]:
    return await rows_as(RateLimitRow, conn, Q["read"], None)


async def apply_reports(conn: Conn, accepted: Sequence[CheckedResult]) -> None:
    """Within the Complete transaction, for its accepted results: usage replaces the
    grants' estimates, slow-down reports pause their limits."""
    usage = [(r.dispatch_id, name, units) for r in accepted for name, units in r.usage]
    if usage:
        await conn.execute(
            Q["report_usage"],
            [d for d, _, _ in usage],
            [name for _, name, _ in usage],
            [units for _, _, units in usage],
        )
    slow = [(name, ms) for r in accepted for name, ms in r.slow_down]
    if slow:
        await locks.rate_limits(conn, [name for name, _ in slow])
        for row in await conn.fetch(Q["slow_down"], [n for n, _ in slow], [ms for _, ms in slow]):
            log.info(
                "rate limit paused by a slow-down report",
                extra={"limit": row["name"], "until": row["paused_until"].isoformat()},
            )
