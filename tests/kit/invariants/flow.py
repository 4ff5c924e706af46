"""The invariants of flow control (docs/design.md §17), checked in every committed state
(committed.py).

1. A lease holds exactly its task's concurrency keys: every dispatch's keys and maxes
   are its task's (rendered once, when the task was created).
2. Never over a key's max, now: the live (pending or leased) dispatches holding a key
   number at most the max of the one granted last (the grant counted all the others).
3. Never over a key's max, at any instant of the attempt history: at each attempt's
   start, the attempts holding one of its keys and running then number at most the max
   of the one granted last among them. (An attempt ends in the transaction that ends its
   lease, and a grant sees only leases ended before it, so an attempt the grant did not
   count finished before the granted one started.)
4. No unit held by an ended lease: a dispatch that holds a key is live only while its
   task is queued or running; so once nothing is queued or running, no unit is held.
5. A rate limit never exceeded in any window: at each grant, the units charged to the
   limit in the period ending then, as the grant knew them (reported usage for reports
   committed before it, the estimate otherwise, and the smaller of the two for a report
   within REPORT_SLACK of it, whose commit the grant may or may not have seen), are at
   most the budget in force. (Every window's worst case ends at a grant.)
6. Each charge belongs to a dispatch whose task uses that limit, for the units it
   declares.
"""

from __future__ import annotations

from kit.invariants.common import Db

# A report's clock_timestamp() precedes its commit; a grant that read the charges in
# between saw the estimate, not yet the usage.
REPORT_SLACK = "1 second"


async def flow_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """SELECT d.id, d.concurrency_keys, d.concurrency_max, t.concurrency_keys AS task_keys,
                  t.concurrency_max AS task_max
             FROM dispatches d JOIN tasks t ON t.id = d.task_id
            WHERE (d.concurrency_keys, d.concurrency_max)
                  IS DISTINCT FROM (t.concurrency_keys, t.concurrency_max)"""
    ):
        problems.append(
            f"dispatch {row['id']} holds {list(row['concurrency_keys'])} "
            f"(max {list(row['concurrency_max'])}); its task declares {list(row['task_keys'])} "
            f"(max {list(row['task_max'])})"
        )
    for row in await conn.fetch(
        """SELECT k.key, count(*) AS n,
                  (array_agg(k.max ORDER BY d.id DESC))[1] AS allowed
             FROM dispatches d
             CROSS JOIN LATERAL unnest(d.concurrency_keys, d.concurrency_max) AS k (key, max)
            WHERE d.state IN ('pending', 'leased')
            GROUP BY k.key
           HAVING count(*) > (array_agg(k.max ORDER BY d.id DESC))[1]"""
    ):
        problems.append(
            f"key {row['key']!r}: {row['n']} live leases hold it, over its max {row['allowed']}"
        )
    for row in await conn.fetch(
        """WITH held AS (
               SELECT a.id, a.started_at, coalesce(a.finished_at, 'infinity') AS ended,
                      a.dispatch_id, k.key, k.max
                 FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id
                 CROSS JOIN LATERAL unnest(d.concurrency_keys, d.concurrency_max) AS k (key, max)
           )
           SELECT h.key, h.started_at, count(*) AS n,
                  (array_agg(o.max ORDER BY o.dispatch_id DESC))[1] AS allowed
             FROM held h
             JOIN held o ON o.key = h.key AND o.started_at <= h.started_at
                        AND h.started_at < o.ended
            GROUP BY h.id, h.key, h.started_at
           HAVING count(*) > (array_agg(o.max ORDER BY o.dispatch_id DESC))[1]
            ORDER BY h.started_at
            LIMIT 10"""
    ):
        problems.append(
            f"key {row['key']!r}: {row['n']} attempts holding it were running at "
            f"{row['started_at'].isoformat()}, over its max {row['allowed']}"
        )
    for row in await conn.fetch(
        """SELECT d.id, d.state, t.key, t.state AS task_state, d.concurrency_keys
             FROM dispatches d JOIN tasks t ON t.id = d.task_id
            WHERE d.state IN ('pending', 'leased') AND cardinality(d.concurrency_keys) > 0
              AND t.state NOT IN ('queued', 'running')"""
    ):
        problems.append(
            f"dispatch {row['id']} ({row['state']}) still holds {list(row['concurrency_keys'])} "
            f"but its task {row['key']!r} is {row['task_state']}: a unit leaked"
        )
    problems.extend(await _rate_problems(conn))
    return problems


async def _rate_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        f"""SELECT c.limit_name, c.granted_at, c.budget_units, c.period_ms,
                  (SELECT sum(CASE
                       WHEN o.dispatch_id = c.dispatch_id OR o.reported_at IS NULL
                            OR o.reported_at > c.granted_at THEN o.estimate
                       WHEN o.reported_at > c.granted_at - interval '{REPORT_SLACK}'
                            THEN least(o.estimate, o.actual)
                       ELSE o.actual END)
                     FROM rate_charges o
                    WHERE o.limit_name = c.limit_name AND o.granted_at <= c.granted_at
                      AND o.granted_at > c.granted_at - c.period_ms * interval '1 millisecond'
                  ) AS charged
             FROM rate_charges c
            ORDER BY c.granted_at"""
    ):
        if row["charged"] > row["budget_units"]:
            problems.append(
                f"rate limit {row['limit_name']!r}: {row['charged']} units charged in the "
                f"{row['period_ms']} ms ending {row['granted_at'].isoformat()}, over its "
                f"{row['budget_units']}"
            )
            if len(problems) >= 10:
                break
    for row in await conn.fetch(
        """SELECT c.dispatch_id, c.limit_name, c.estimate
             FROM rate_charges c JOIN dispatches d ON d.id = c.dispatch_id
             JOIN tasks t ON t.id = d.task_id
            WHERE NOT EXISTS (SELECT 1 FROM unnest(t.rate_names, t.rate_units) AS u (name, units)
                               WHERE u.name = c.limit_name AND u.units = c.estimate)"""
    ):
        problems.append(
            f"dispatch {row['dispatch_id']} charged {row['estimate']} of {row['limit_name']!r}, "
            "which its task does not declare"
        )
    return problems
