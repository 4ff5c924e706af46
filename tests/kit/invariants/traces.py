"""The invariant of run traces (docs/observability.md), checked in SQL over one
snapshot, part of every check_committed and check_invariants:

1. A run's own span is exported only once the run has finished: a traced run whose
   span is no longer pending has finished (its span covers the whole run, and a span
   exported early would end before the run does and never be sent again).
"""

from __future__ import annotations

from kit.invariants.common import Db


async def trace_problems(conn: Db) -> list[str]:
    return [
        f"run {row['id']}: its span was exported while it was still {row['state']}"
        for row in await conn.fetch(
            """SELECT id, state FROM runs
                WHERE trace_id IS NOT NULL AND NOT trace_pending AND finished_at IS NULL"""
        )
    ]
