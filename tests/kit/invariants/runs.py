"""What a finished scenario must show for each run it names: the expected states, one
accepted result per succeeded task, results only from current leases; and what its
tasks cost."""

from __future__ import annotations

from uuid import UUID

from awp_protocol.states import TERMINAL_TASK_STATES
from kit.invariants.common import Db, Expect, RunCost

# A result is judged against the clock read once the locks are held; the dispatch's
# finished_at is written a moment later in the same transaction. A lease that ran out
# inside that moment was still valid when judged, so the check allows this much.
JUDGE_TO_WRITE_SLACK_S = 0.5


async def run_problems(conn: Db, run_id: UUID, expect: Expect) -> list[str]:
    """Every broken invariant of one finished run."""
    return [
        *await _run_state(conn, run_id, expect),
        *await _tasks(conn, run_id, expect),
        *await _accepted_results(conn, run_id),
        *await _fencing(conn, run_id),
    ]


async def _run_state(conn: Db, run_id: UUID, expect: Expect) -> list[str]:
    state = await conn.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
    if state is None:
        return [f"run {run_id} does not exist"]
    if state != expect.run_state:
        return [f"run {run_id} is {state}, expected {expect.run_state}"]
    return []


async def _tasks(conn: Db, run_id: UUID, expect: Expect) -> list[str]:
    problems = []
    for row in await conn.fetch(
        "SELECT key, state FROM tasks WHERE run_id = $1 ORDER BY id", run_id
    ):
        wanted = expect.task_state(row["key"])
        if row["state"] not in TERMINAL_TASK_STATES:
            problems.append(f"task {row['key']} is not terminal: {row['state']}")
        elif wanted is not None and row["state"] != wanted:
            problems.append(f"task {row['key']} is {row['state']}, expected {wanted}")
    return problems


async def _accepted_results(conn: Db, run_id: UUID) -> list[str]:
    """Succeeded task <-> exactly one succeeded attempt, the latest, properly completed
    (a map task has no attempt of its own: its elements do, each one checked here)."""
    rows = await conn.fetch(
        """
        SELECT t.key, t.state, t.attempts, t.output, t.reused_from_run_id IS NOT NULL AS reused,
               count(a.id) FILTER (WHERE a.state = 'succeeded') AS succeeded,
               max(a.attempt) AS latest,
               max(a.attempt) FILTER (WHERE a.state = 'succeeded') AS succeeded_attempt,
               count(a.id) AS rows
          FROM tasks t LEFT JOIN attempts a ON a.task_id = t.id
         WHERE t.run_id = $1 AND t.map_over IS NULL
         GROUP BY t.id
         ORDER BY t.id
        """,
        run_id,
    )
    problems = []
    for row in rows:
        key = row["key"]
        if row["reused"]:
            if row["state"] != "succeeded" or row["rows"]:
                problems.append(f"task {key} reused yet {row['state']} with {row['rows']} attempts")
        elif row["state"] == "succeeded":
            if row["succeeded"] != 1:
                problems.append(f"task {key} succeeded with {row['succeeded']} succeeded attempts")
            elif row["succeeded_attempt"] != row["latest"]:
                problems.append(
                    f"task {key}: attempt {row['succeeded_attempt']} succeeded but "
                    f"attempt {row['latest']} came after it"
                )
        elif row["succeeded"]:
            problems.append(f"task {key} is {row['state']} yet has a succeeded attempt")
        if row["rows"] != row["attempts"]:
            problems.append(
                f"task {key} counts {row['attempts']} attempts but has {row['rows']} attempt rows"
            )
    # An output is stored once, on its task, and only by a success: the accepted result
    # (its hash on the succeeded attempt's dispatch) or a reused one (checked below).
    for row in await conn.fetch(
        """
        SELECT t.key, t.state,
               (SELECT count(*) FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id
                 WHERE a.task_id = t.id AND a.state = 'succeeded'
                   AND d.state = 'completed' AND d.result_hash IS NOT NULL) AS accepted
          FROM tasks t
         WHERE t.run_id = $1 AND t.output IS NOT NULL
        """,
        run_id,
    ):
        if row["state"] != "succeeded":
            problems.append(f"task {row['key']} is {row['state']} yet has an output")
        elif row["accepted"] > 1:
            problems.append(f"task {row['key']}: {row['accepted']} attempts' results accepted")
    for row in await conn.fetch(
        """
        SELECT t.key
          FROM tasks t JOIN tasks s ON s.run_id = t.reused_from_run_id AND s.key = t.key
         WHERE t.run_id = $1 AND t.output IS DISTINCT FROM s.output
        """,
        run_id,
    ):
        problems.append(f"task {row['key']}: its output is not the output it reused")
    return problems


async def _fencing(conn: Db, run_id: UUID) -> list[str]:
    """Every written result came from the current lease of the current attempt."""
    problems = []
    rows = await conn.fetch(
        """
        SELECT t.key, a.attempt, a.state AS attempt_state, d.id AS dispatch_id,
               d.state AS dispatch_state, d.result_hash IS NOT NULL AS has_hash,
               d.worker_id = a.worker_id AS same_worker,
               d.fencing_token = a.fencing_token AS same_token,
               extract(epoch FROM d.finished_at - d.lease_expires_at) AS past_lease_s,
               extract(epoch FROM d.finished_at - d.attempt_deadline) AS past_deadline_s,
               EXISTS (SELECT 1 FROM attempts b
                        WHERE b.task_id = a.task_id AND b.attempt > a.attempt
                          AND b.started_at <= d.finished_at) AS superseded
          FROM attempts a
          JOIN dispatches d ON d.id = a.dispatch_id
          JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1 AND (a.state IN ('succeeded', 'failed') OR d.state = 'completed')
         ORDER BY t.id, a.attempt
        """,
        run_id,
    )
    for row in rows:
        what = f"task {row['key']} attempt {row['attempt']} (dispatch {row['dispatch_id']})"
        if row["attempt_state"] not in ("succeeded", "failed"):
            problems.append(f"{what}: dispatch completed but the attempt is {row['attempt_state']}")
            continue
        if row["dispatch_state"] != "completed" or not row["has_hash"]:
            problems.append(
                f"{what}: attempt {row['attempt_state']} but its dispatch is "
                f"{row['dispatch_state']} (result hash {'set' if row['has_hash'] else 'missing'})"
            )
        if not row["same_worker"] or not row["same_token"]:
            problems.append(f"{what}: dispatch and attempt disagree on holder or fencing token")
        if row["superseded"]:
            problems.append(f"{what}: result written after a later attempt had started")
        if row["past_lease_s"] is not None and row["past_lease_s"] > JUDGE_TO_WRITE_SLACK_S:
            problems.append(f"{what}: result written {row['past_lease_s']:.3f} s after its lease")
        if row["past_deadline_s"] is not None and row["past_deadline_s"] > JUDGE_TO_WRITE_SLACK_S:
            problems.append(
                f"{what}: result written {row['past_deadline_s']:.3f} s after its deadline"
            )
    # Stale attempts must have lost their dispatch in the matching way.
    for row in await conn.fetch(
        """
        SELECT t.key, a.attempt, a.state, d.state AS dispatch_state
          FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1
           AND ((a.state IN ('interrupted', 'timed_out') AND d.state <> 'expired')
             OR (a.state = 'canceled' AND d.state <> 'canceled'))
        """,
        run_id,
    ):
        problems.append(
            f"task {row['key']} attempt {row['attempt']} is {row['state']} "
            f"but its dispatch is {row['dispatch_state']}"
        )
    return problems


async def cost(conn: Db, run_id: UUID) -> RunCost:
    cost = RunCost(run_id)
    per_task = await conn.fetch(
        """
        SELECT count(a.id) AS n
          FROM tasks t LEFT JOIN attempts a ON a.task_id = t.id
         WHERE t.run_id = $1 GROUP BY t.id
        """,
        run_id,
    )
    cost.tasks = len(per_task)
    cost.executions = sum(row["n"] for row in per_task)
    cost.tasks_with_extra_executions = sum(1 for row in per_task if row["n"] > 1)
    cost.extra_executions = sum(row["n"] - 1 for row in per_task if row["n"] > 1)
    cost.max_executions_per_task = max((row["n"] for row in per_task), default=0)
    for row in await conn.fetch(
        "SELECT state, count(*) AS n FROM attempts WHERE run_id = $1 GROUP BY state", run_id
    ):
        cost.attempts_by_state[row["state"]] = row["n"]
    cost.workers = await conn.fetchval(
        "SELECT count(DISTINCT worker_id) FROM attempts WHERE run_id = $1", run_id
    )
    return cost
