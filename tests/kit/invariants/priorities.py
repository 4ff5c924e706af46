"""The invariants of priorities with aging (docs/design.md §17), checked in every
committed state (committed.py). Each dispatch records the effective priority the grant
ranked its task at (migration 0019), and the dispatches of one grant pass share their
created_at (the transaction's now()) and were created in the order the grant chose them.

1. Higher first within a pass: in one pass, by dispatch id, the recorded priority never
   rises. (Across passes the candidates differ, so no order between passes is implied.)
2. Aging never lowers a priority and never passes the range: a dispatch's priority is at
   least its task's base (its run's plus its own, clamped) and at most MAX_PRIORITY.
"""

from __future__ import annotations

from awp_protocol.limits import MAX_PRIORITY, MIN_PRIORITY
from kit.invariants.common import Db


async def priority_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """SELECT d.id, d.priority, d.created_at, p.id AS before, p.priority AS before_priority
             FROM dispatches d
             JOIN LATERAL (SELECT e.id, e.priority FROM dispatches e
                            WHERE e.created_at = d.created_at AND e.id < d.id
                              AND e.priority IS NOT NULL
                            ORDER BY e.id DESC LIMIT 1) p ON true
            WHERE d.priority IS NOT NULL AND d.priority > p.priority
            ORDER BY d.id LIMIT 10"""
    ):
        problems.append(
            f"dispatch {row['id']} (priority {row['priority']}) was granted after dispatch "
            f"{row['before']} (priority {row['before_priority']}) in the same pass "
            f"({row['created_at'].isoformat()}): higher must go first"
        )
    for row in await conn.fetch(
        """SELECT d.id, d.priority,
                  greatest($1::int, least($2::int, r.priority + t.priority)) AS base
             FROM dispatches d JOIN tasks t ON t.id = d.task_id JOIN runs r ON r.id = d.run_id
            WHERE d.priority < greatest($1::int, least($2::int, r.priority + t.priority))
               OR d.priority > $2::int
            ORDER BY d.id LIMIT 10""",
        MIN_PRIORITY,
        MAX_PRIORITY,
    ):
        problems.append(
            f"dispatch {row['id']} was granted at priority {row['priority']}: outside its "
            f"task's base {row['base']} to {MAX_PRIORITY}"
        )
    return problems
