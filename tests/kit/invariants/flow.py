"""The invariants of flow control (docs/design.md §16), checked in every committed state
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
"""

from __future__ import annotations

from kit.invariants.common import Db


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
    return problems
