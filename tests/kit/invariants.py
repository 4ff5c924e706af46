"""The invariants of the database (DESIGN.md §10), checked in SQL: the one checker of the
coordinator tests (after every step) and the fault scenarios (once the processes have
done their worst).

check_committed: what holds in every committed state, over the whole database --
a run's and the fleet's concurrency limits, each task's state agreeing with its
dispatches and attempts, each map task agreeing with its elements, items 4 and 5 below
for every run.

check_invariants: what a finished scenario must show for the runs it names, plus
everything check_committed checks:

1. Every task is in its expected terminal state; the run too.
2. Exactly one accepted result per succeeded task: one succeeded attempt, the task's
   latest, whose dispatch is `completed` with a result hash, held by the same worker
   under the same fencing token; no other task has a succeeded attempt. A task a retry
   reused instead (RetryRun) has no attempt at all, and the output of the task it names.
3. No result accepted from a non-current lease: every completed dispatch belongs to a
   succeeded/failed attempt that was still the task's latest when it was written, and
   was written before the lease and the attempt deadline ran out.
4. Each run's event seqs are exactly 1..last_seq, its revisions exactly 1..revision and
   never decreasing along seq (every state transaction appends events and bumps once).
5. Nothing is left leased to a stopped or offline worker, and a finished run holds no
   live dispatch and no running attempt.
6. Output streams: no chunk stored after its lease ended, offsets contiguous per
   attempt, positions per task (kit.stream_invariants).

The checker also reports how many executions the tasks cost: at-least-once is paid for
in extra attempts, and the output should show that price, not hide it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

from awp_protocol.states import TERMINAL_TASK_STATES
from kit.stream_invariants import stream_problems

# Any way to run a query: the checker takes a connection or a pool.
Db = asyncpg.Connection | asyncpg.Pool

# A result is judged against the clock read once the locks are held; the dispatch's
# finished_at is written a moment later in the same transaction. A lease that ran out
# inside that moment was still valid when judged, so the check allows this much.
JUDGE_TO_WRITE_SLACK_S = 0.5


@dataclass(frozen=True, slots=True)
class Expect:
    """What one run must end as. task_states: one state for every task, or per key
    (keys not listed must then be `default_task_state`)."""

    run_state: str = "succeeded"
    task_states: str | Mapping[str, str] = "succeeded"
    default_task_state: str | None = None

    def task_state(self, key: str) -> str | None:
        if isinstance(self.task_states, str):
            return self.task_states
        return self.task_states.get(key, self.default_task_state)


@dataclass(slots=True)
class RunCost:
    run_id: UUID
    tasks: int = 0
    executions: int = 0  # attempt rows: every execution a worker was handed
    attempts_by_state: Counter[str] = field(default_factory=Counter)
    tasks_with_extra_executions: int = 0
    max_executions_per_task: int = 0
    workers: int = 0

    # Executions beyond the first of each task: the price of at-least-once (and retries).
    extra_executions: int = 0

    def line(self) -> str:
        states = ",".join(f"{k}={v}" for k, v in sorted(self.attempts_by_state.items()))
        return (
            f"COST run={str(self.run_id)[:8]} tasks={self.tasks} executions={self.executions}"
            f" extra={self.extra_executions} tasks_repeated={self.tasks_with_extra_executions}"
            f" max_per_task={self.max_executions_per_task} workers={self.workers}"
            f" attempts[{states}]"
        )


class InvariantViolation(AssertionError):
    pass


async def check_committed(
    db: Db, *, global_limit: int = 0, finished: bool = False
) -> dict[str, int]:
    """Raises InvariantViolation unless every committed-state invariant holds (and, with
    finished, no run is still running); returns the live and leased dispatch counts."""
    async with _snapshot(db) as conn:
        problems, counts = await _committed(conn, global_limit)
        if finished:
            unfinished = await conn.fetchval("SELECT count(*) FROM runs WHERE state = 'running'")
            if unfinished:
                problems.append(f"{unfinished} runs still running")
    _raise_if_any(problems)
    return counts


async def check_invariants(db: Db, expected: Mapping[UUID, Expect]) -> dict[UUID, RunCost]:
    """Raises InvariantViolation listing every broken invariant; returns each run's cost."""
    costs: dict[UUID, RunCost] = {}
    async with _snapshot(db) as conn:
        problems, _ = await _committed(conn)
        for run_id, expect in expected.items():
            problems.extend(await _run_state(conn, run_id, expect))
            problems.extend(await _tasks(conn, run_id, expect))
            problems.extend(await _accepted_results(conn, run_id))
            problems.extend(await _fencing(conn, run_id))
            costs[run_id] = await _cost(conn, run_id)
    for cost in costs.values():
        print(cost.line(), flush=True)
    _raise_if_any(problems)
    return costs


@contextlib.asynccontextmanager
async def _snapshot(db: Db) -> AsyncIterator[asyncpg.Connection]:
    """One consistent view of the database: every check sees the same committed state."""
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(db, asyncpg.Pool):
            db = await stack.enter_async_context(db.acquire())
        await stack.enter_async_context(db.transaction(isolation="repeatable_read"))
        yield db


def _raise_if_any(problems: list[str]) -> None:
    if problems:
        raise InvariantViolation(
            f"{len(problems)} invariant violation(s):\n" + "\n".join(f"  - {p}" for p in problems)
        )


async def _committed(conn: Db, global_limit: int = 0) -> tuple[list[str], dict[str, int]]:
    counts = dict(
        await conn.fetchrow(
            """SELECT count(*) FILTER (WHERE state IN ('pending', 'leased')) AS live,
                      count(*) FILTER (WHERE state = 'leased') AS leased
                 FROM dispatches"""
        )
    )
    problems = []
    if global_limit and counts["live"] > global_limit:
        problems.append(f"{counts['live']} live dispatches over the limit {global_limit}")
    problems.extend(await _limits(conn))
    problems.extend(await _tasks_agree_with_dispatches(conn))
    problems.extend(await _maps_agree_with_elements(conn))
    problems.extend(await _leased_to_gone_workers(conn))
    problems.extend(await stream_problems(conn, JUDGE_TO_WRITE_SLACK_S))
    for run in await conn.fetch("SELECT id FROM runs ORDER BY id"):
        problems.extend(await _event_log(conn, run["id"]))
        problems.extend(await _nothing_live(conn, run["id"]))
    return problems, counts


async def _limits(conn: Db) -> list[str]:
    problems = []
    over = await conn.fetch(
        """SELECT r.id, r.concurrency, count(t.id) AS n
             FROM runs r JOIN tasks t ON t.run_id = r.id
            WHERE r.concurrency > 0 AND t.state IN ('queued', 'running') AND t.map_over IS NULL
            GROUP BY r.id HAVING count(t.id) > r.concurrency"""
    )
    if over:
        problems.append(f"runs over their concurrency: {[dict(r) for r in over]}")
    busy = await conn.fetch(
        """SELECT w.id, w.max_concurrency, count(d.id) AS n
             FROM workers w JOIN dispatches d ON d.worker_id = w.id AND d.state = 'leased'
            GROUP BY w.id HAVING count(d.id) > w.max_concurrency"""
    )
    if busy:
        problems.append(f"workers over max_concurrency: {[dict(r) for r in busy]}")
    return problems


async def _tasks_agree_with_dispatches(conn: Db) -> list[str]:
    """A queued task has one pending dispatch; a running one a leased dispatch and a
    running attempt (but a map task: its elements run); any other, neither. Its attempt
    counter counts its attempt rows."""
    problems = []
    for row in await conn.fetch(
        """SELECT t.id, t.state,
                  (SELECT count(*) FROM dispatches d
                    WHERE d.task_id = t.id AND d.state = 'pending') AS pending,
                  (SELECT count(*) FROM dispatches d
                    WHERE d.task_id = t.id AND d.state = 'leased') AS leased,
                  (SELECT count(*) FROM attempts a
                    WHERE a.task_id = t.id AND a.state = 'running') AS running,
                  (SELECT count(*) FROM attempts a WHERE a.task_id = t.id) AS attempts,
                  t.attempts AS counted, t.map_over IS NOT NULL AS is_map
             FROM tasks t"""
    ):
        expected = {"queued": (1, 0, 0), "running": (0, 1, 1)}.get(row["state"], (0, 0, 0))
        if row["is_map"]:
            expected = (0, 0, 0)
        got = (row["pending"], row["leased"], row["running"])
        if got != expected:
            problems.append(f"task {row['id']} {row['state']}: {got} != {expected}")
        if row["attempts"] != row["counted"]:
            problems.append(f"task {row['id']} attempts mismatch")
    return problems


async def _maps_agree_with_elements(conn: Db) -> list[str]:
    """A map task that has started has exactly map_size elements, keyed "<key>[i]" with
    indexes 0..n-1 and its input plus the element; while running, elements_left counts
    those not succeeded; succeeded, every element did and its output is theirs in order;
    ended any other way, none of them is still live. Elements exist only for a started
    map task."""
    problems = []
    for row in await conn.fetch(
        """SELECT m.key, m.state, m.map_size, m.elements_left,
                  count(e.id) AS n,
                  count(e.id) FILTER (WHERE e.key = m.key || '[' || e.map_index || ']'
                                        AND e.input - 'item' - 'index' = m.input
                                        AND (e.input -> 'index')::int = e.map_index) AS well_made,
                  count(DISTINCT e.map_index) AS indexes, max(e.map_index) AS top,
                  count(e.id) FILTER (WHERE e.state <> 'succeeded') AS unsucceeded,
                  count(e.id) FILTER (WHERE e.state IN ('pending', 'ready', 'queued', 'running',
                                                        'waiting_retry')) AS live,
                  m.output IS NOT DISTINCT FROM jsonb_build_object(
                      'outputs', coalesce(jsonb_agg(e.output ORDER BY e.map_index)
                                          FILTER (WHERE e.id IS NOT NULL), '[]')) AS combined
             FROM tasks m LEFT JOIN tasks e ON e.parent_id = m.id
            WHERE m.map_over IS NOT NULL
            GROUP BY m.id"""
    ):
        what = f"map task {row['key']} ({row['state']})"
        if row["map_size"] is None:
            if row["n"]:
                problems.append(f"{what}: {row['n']} elements but never started")
            continue
        if not row["n"] == row["indexes"] == row["well_made"] == row["map_size"] or (
            row["n"] and row["top"] != row["n"] - 1
        ):
            problems.append(
                f"{what}: map_size {row['map_size']} but {row['n']} elements, "
                f"{row['indexes']} indexes up to {row['top']}, {row['well_made']} well made"
            )
        if row["state"] == "running" and row["elements_left"] != row["unsucceeded"]:
            problems.append(
                f"{what}: elements_left {row['elements_left']} but "
                f"{row['unsucceeded']} elements not succeeded"
            )
        if row["state"] == "succeeded" and (row["unsucceeded"] or not row["combined"]):
            problems.append(f"{what}: its output is not its elements' outputs in order")
        if row["state"] not in ("running", "succeeded") and row["live"]:
            problems.append(f"{what}: {row['live']} elements still live")
    orphans = await conn.fetchval(
        """SELECT count(*) FROM tasks e JOIN tasks m ON m.id = e.parent_id
            WHERE m.map_size IS NULL OR e.run_id <> m.run_id"""
    )
    if orphans:
        problems.append(f"{orphans} elements of a map task that never started")
    return problems


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
    # The accepted result is the one recorded on the task.
    for row in await conn.fetch(
        """
        SELECT t.key
          FROM tasks t JOIN attempts a ON a.task_id = t.id AND a.state = 'succeeded'
         WHERE t.run_id = $1 AND t.output IS DISTINCT FROM a.output
        """,
        run_id,
    ):
        problems.append(f"task {row['key']}: its output is not its succeeded attempt's output")
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


async def _event_log(conn: Db, run_id: UUID) -> list[str]:
    row = await conn.fetchrow(
        """
        SELECT r.revision, r.last_seq,
               count(e.seq) AS events, min(e.seq) AS first_seq, max(e.seq) AS max_seq,
               count(DISTINCT e.revision) AS revisions, min(e.revision) AS first_revision,
               max(e.revision) AS max_revision
          FROM runs r LEFT JOIN state_events e ON e.run_id = r.id
         WHERE r.id = $1
         GROUP BY r.id
        """,
        run_id,
    )
    if row is None:
        return []
    problems = []
    if row["events"] != row["last_seq"] or (
        row["events"] and (row["first_seq"] != 1 or row["max_seq"] != row["last_seq"])
    ):
        problems.append(
            f"event seqs are not 1..{row['last_seq']}: {row['events']} events, "
            f"seq {row['first_seq']}..{row['max_seq']}"
        )
    if (
        row["max_revision"] != row["revision"]
        or row["revisions"] != row["revision"]
        or (row["revisions"] and row["first_revision"] != 1)
    ):
        problems.append(
            f"revisions are not 1..{row['revision']}: {row['revisions']} distinct, "
            f"{row['first_revision']}..{row['max_revision']}"
        )
    backwards = await conn.fetchval(
        """
        SELECT count(*) FROM (
            SELECT revision < lag(revision) OVER (ORDER BY seq) AS back
              FROM state_events WHERE run_id = $1) x
         WHERE back
        """,
        run_id,
    )
    if backwards:
        problems.append(f"revision decreases {backwards} time(s) along seq")
    return problems


async def _nothing_live(conn: Db, run_id: UUID) -> list[str]:
    row = await conn.fetchrow(
        """
        SELECT r.state,
               (SELECT count(*) FROM dispatches d
                 WHERE d.run_id = r.id AND d.state IN ('pending', 'leased')) AS live_dispatches,
               (SELECT count(*) FROM attempts a
                 WHERE a.run_id = r.id AND a.state = 'running') AS running_attempts,
               (SELECT count(*) FROM tasks t
                 WHERE t.run_id = r.id
                   AND t.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry'))
                 AS live_tasks
          FROM runs r WHERE r.id = $1
        """,
        run_id,
    )
    if row is None or row["state"] == "running":
        return []
    problems = []
    if row["live_dispatches"]:
        problems.append(f"run is {row['state']} but {row['live_dispatches']} dispatches are live")
    if row["running_attempts"]:
        problems.append(f"run is {row['state']} but {row['running_attempts']} attempts run")
    if row["live_tasks"]:
        problems.append(f"run is {row['state']} but {row['live_tasks']} tasks are live")
    return problems


async def _leased_to_gone_workers(conn: Db) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT d.id, w.name, w.state
          FROM dispatches d JOIN workers w ON w.id = d.worker_id
         WHERE d.state = 'leased' AND w.state IN ('stopped', 'offline')
        """
    )
    return [
        f"dispatch {row['id']} is still leased to {row['state']} worker {row['name']}"
        for row in rows
    ]


async def _cost(conn: Db, run_id: UUID) -> RunCost:
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
