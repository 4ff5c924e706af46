"""The invariants of step checkpoints (docs/design.md §16), checked in every committed
state (committed.py): no checkpoint stored by a stale attempt.

1. A checkpoint an attempt stored names that attempt: its dispatch is the attempt's,
   with the attempt's number and fencing token, of the checkpoint's own task and run.
2. It was stored while that lease was live: before the attempt ended (its dispatch
   settled), before its attempt deadline, and before any later attempt of its task
   started.
3. A step's memo was stored by an attempt (only a wait's outcome may be stored by a
   timer or a decision, with no attempt).
"""

from __future__ import annotations

from kit.invariants.common import Db
from kit.invariants.runs import JUDGE_TO_WRITE_SLACK_S


async def checkpoint_problems(conn: Db) -> list[str]:
    problems = []
    for row in await conn.fetch(
        """
        SELECT c.task_id, c.kind, c.name, c.occurrence, c.dispatch_id, c.attempt,
               c.fencing_token, a.attempt AS dispatch_attempt,
               a.fencing_token AS dispatch_token, a.task_id AS dispatch_task,
               a.run_id AS dispatch_run, c.run_id,
               c.recorded_at > a.finished_at AS after_ended,
               c.recorded_at > d.finished_at AS after_settled,
               extract(epoch FROM c.recorded_at - d.attempt_deadline) AS past_deadline_s,
               EXISTS (SELECT 1 FROM attempts b
                        WHERE b.task_id = c.task_id AND b.attempt > c.attempt
                          AND b.started_at <= c.recorded_at) AS superseded
          FROM checkpoints c
          LEFT JOIN attempts a ON a.dispatch_id = c.dispatch_id
          LEFT JOIN dispatches d ON d.id = c.dispatch_id
         WHERE c.dispatch_id IS NOT NULL
        """
    ):
        what = (
            f"checkpoint {row['kind']} {row['name']!r}#{row['occurrence']} of task {row['task_id']}"
        )
        stored_as = (row["task_id"], row["run_id"], row["attempt"], row["fencing_token"])
        lease = (
            row["dispatch_task"],
            row["dispatch_run"],
            row["dispatch_attempt"],
            row["dispatch_token"],
        )
        if stored_as != lease:
            problems.append(
                f"{what}: stored as (task, run, attempt, fencing token) {stored_as}, but its "
                f"dispatch {row['dispatch_id']} is {lease}"
            )
        if row["after_ended"] or row["after_settled"]:
            problems.append(f"{what}: stored after its attempt ended (a stale attempt's memo)")
        if row["superseded"]:
            problems.append(f"{what}: stored after a later attempt of its task had started")
        if row["past_deadline_s"] is not None and row["past_deadline_s"] > JUDGE_TO_WRITE_SLACK_S:
            problems.append(f"{what}: stored {row['past_deadline_s']:.3f} s after its deadline")
    orphans = await conn.fetchval(
        "SELECT count(*) FROM checkpoints WHERE kind = 'step' AND dispatch_id IS NULL"
    )
    if orphans:
        problems.append(f"{orphans} step memos stored by no attempt")
    return problems
