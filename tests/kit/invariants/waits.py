"""The invariants of waits and signals (docs/design.md §16), checked in every committed
state (committed.py).

1. Every signal is consumed at most once, and each wait that a signal satisfied
   consumed exactly one: the signals a task consumed under a name are exactly its
   satisfied (not timed-out) signal waits of that name, paired in order (the k-th
   consumed, by id, is the k-th occurrence) with the same payload.
2. Signals of one (run, name) are consumed oldest first: none is still buffered while
   a newer one of its name was consumed.
3. A suspended attempt is never charged: a task's `suspensions` is its number of
   SUSPENDED attempts (what max_attempts bounds is attempts - hand_backs - suspensions),
   and a suspended attempt's lease is over. (That a WAITING task holds no dispatch and
   no running attempt is committed.py's rule for every task not queued or running.)
"""

from __future__ import annotations

from kit.invariants.common import Db


async def wait_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """
        WITH consumed AS (
            SELECT consumed_by_task AS task_id, name, payload,
                   row_number() OVER (PARTITION BY consumed_by_task, name ORDER BY id) - 1 AS k
              FROM signals WHERE consumed_by_task IS NOT NULL
        ), waited AS (
            SELECT task_id, name, value AS payload,
                   row_number() OVER (PARTITION BY task_id, name ORDER BY occurrence) - 1 AS k
              FROM checkpoints WHERE kind = 'signal' AND NOT timed_out
        )
        SELECT coalesce(c.task_id, w.task_id) AS task_id, coalesce(c.name, w.name) AS name,
               coalesce(c.k, w.k) AS k, c.payload IS NOT NULL AS has_signal,
               w.payload IS NOT NULL AS has_wait
          FROM consumed c FULL JOIN waited w
            ON w.task_id = c.task_id AND w.name = c.name AND w.k = c.k
         WHERE c.payload IS DISTINCT FROM w.payload
        """
    ):
        what = f"task {row['task_id']}, signal {row['name']!r} #{row['k']}"
        if not row["has_wait"]:
            problems.append(f"{what}: a signal consumed by no wait of the task")
        elif not row["has_signal"]:
            problems.append(f"{what}: a satisfied signal wait that consumed no signal")
        else:
            problems.append(f"{what}: the wait's payload is not the consumed signal's")
    unordered = await conn.fetchval(
        """SELECT count(*) FROM signals b
            WHERE b.consumed_by_task IS NULL
              AND EXISTS (SELECT 1 FROM signals c
                           WHERE c.run_id = b.run_id AND c.name = b.name AND c.id > b.id
                             AND c.consumed_by_task IS NOT NULL)"""
    )
    if unordered:
        problems.append(f"{unordered} signals still buffered while a newer one was consumed")
    for row in await conn.fetch(
        """SELECT t.id, t.suspensions,
                  (SELECT count(*) FROM attempts a
                    WHERE a.task_id = t.id AND a.state = 'suspended') AS suspended
             FROM tasks t
            WHERE t.suspensions <> (SELECT count(*) FROM attempts a
                                     WHERE a.task_id = t.id AND a.state = 'suspended')"""
    ):
        problems.append(
            f"task {row['id']}: {row['suspended']} suspended attempts but {row['suspensions']} "
            "counted free (a suspended attempt charged)"
        )
    live = await conn.fetchval(
        """SELECT count(*) FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id
            WHERE a.state = 'suspended' AND d.state IN ('pending', 'leased')"""
    )
    if live:
        problems.append(f"{live} suspended attempts whose lease is still live")
    return problems
