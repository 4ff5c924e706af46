"""The invariants of output streams (DESIGN.md §15), checked in every committed state
(committed.py).

1. No chunk stored from an attempt after its lease ended: every chunk was written before
   its dispatch was settled, before its attempt deadline, and before any later attempt
   of its task started.
2. Offsets are contiguous per attempt (0..n-1), the chunk's attempt is its dispatch's.
3. Positions are contiguous per task (0..n-1) and follow (attempt, offset) order.
"""

from __future__ import annotations

from kit.invariants.common import Db
from kit.invariants.runs import JUDGE_TO_WRITE_SLACK_S


async def stream_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """
        SELECT c.dispatch_id, c.chunk_offset, c.attempt, a.attempt AS dispatch_attempt,
               c.created_at > d.finished_at AS after_settled,
               extract(epoch FROM c.created_at - d.attempt_deadline) AS past_deadline_s,
               EXISTS (SELECT 1 FROM attempts b
                        WHERE b.task_id = c.task_id AND b.attempt > a.attempt
                          AND b.started_at <= c.created_at) AS superseded
          FROM stream_chunks c
          JOIN dispatches d ON d.id = c.dispatch_id
          LEFT JOIN attempts a ON a.dispatch_id = c.dispatch_id
        """
    ):
        what = f"chunk {row['chunk_offset']} of dispatch {row['dispatch_id']}"
        if row["attempt"] != row["dispatch_attempt"]:
            problems.append(
                f"{what}: stored as attempt {row['attempt']}, its dispatch is attempt "
                f"{row['dispatch_attempt']}"
            )
        if row["after_settled"]:
            problems.append(f"{what}: stored after its lease was settled")
        if row["superseded"]:
            problems.append(f"{what}: stored after a later attempt of its task had started")
        if row["past_deadline_s"] is not None and row["past_deadline_s"] > JUDGE_TO_WRITE_SLACK_S:
            problems.append(f"{what}: stored {row['past_deadline_s']:.3f} s after its deadline")
    for row in await conn.fetch(
        """
        SELECT dispatch_id, count(*) AS n, min(chunk_offset) AS lo, max(chunk_offset) AS hi
          FROM stream_chunks GROUP BY dispatch_id
        """
    ):
        if (row["lo"], row["hi"]) != (0, row["n"] - 1):
            problems.append(
                f"dispatch {row['dispatch_id']}: {row['n']} chunks at offsets "
                f"{row['lo']}..{row['hi']}, not contiguous from 0"
            )
    for row in await conn.fetch(
        """
        SELECT task_id, count(*) AS n, min(position) AS lo, max(position) AS hi,
               bool_and(in_order) AS in_order
          FROM (SELECT task_id, position,
                       row_number() OVER (PARTITION BY task_id ORDER BY attempt, chunk_offset)
                       = row_number() OVER (PARTITION BY task_id ORDER BY position) AS in_order
                  FROM stream_chunks) AS chunks
         GROUP BY task_id
        """
    ):
        if (row["lo"], row["hi"]) != (0, row["n"] - 1):
            problems.append(
                f"task {row['task_id']}: {row['n']} chunks at positions "
                f"{row['lo']}..{row['hi']}, not contiguous from 0"
            )
        if not row["in_order"]:
            problems.append(f"task {row['task_id']}: positions out of (attempt, offset) order")
    return problems
