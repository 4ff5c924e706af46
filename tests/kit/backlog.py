"""A large backlog of finished runs, made in a few set-based statements (retention tests).

Each seeded run is what a real run of `tasks` independent mock tasks leaves behind when it
succeeded at first try: the run, its tasks, one completed dispatch and one succeeded
attempt per task (held by one stopped worker session), and its events (the run's start,
then each task ready -> queued -> running -> succeeded, then the run's end) with seqs
and revisions contiguous from 1. Thousands of runs a second, instead of driving each
through the platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from awp_db.connect import Conn, Pool

WORKFLOW = "retention-backlog"
# Events per seeded run beyond the four per task: the run's start and its end.
RUN_EVENTS = 2
TASK_EVENTS = 4
CHUNK_RUNS = 2000

# The worker every seeded attempt ran on, and the workflow every seeded run is of.
_FIXTURES = """
WITH worker AS (
    INSERT INTO workers (name, protocol_version, executor_kinds, max_concurrency,
                         session_token_hash, state, stopped_at)
    VALUES ('backlog-worker', 1, '{mock}', 10, sha256('backlog'::bytea), 'stopped', now())
    RETURNING id
), workflow AS (
    INSERT INTO workflows (name, version, definition, definition_hash)
    VALUES ($1::text, 1, '{}'::jsonb, sha256(convert_to($1::text, 'UTF8')))
    ON CONFLICT (name, version) DO UPDATE SET name = excluded.name
    RETURNING id
)
SELECT worker.id AS worker_id, workflow.id AS workflow_id FROM worker, workflow
"""

# $1 runs of $2 tasks each, finished $3 seconds ago and one millisecond apart further back
# (the oldest first in retention's order), on worker $4 and workflow $5, in state $6.
_SEED = """
WITH seeded AS (
    SELECT gen_random_uuid() AS id,
           clock_timestamp() - $3::float8 * interval '1 second'
                             - i * interval '1 millisecond' AS finished_at
      FROM generate_series(1, $1::int) AS i
), run AS (
    INSERT INTO runs (id, workflow_id, state, revision, last_seq, created_at, finished_at,
                      last_dispatched_at, started_by)
    SELECT id, $5, $6, 2 + 4 * $2::int, $7::int + $8::int * $2::int,
           finished_at - interval '1 minute', finished_at, finished_at - interval '50 seconds',
           'backlog'
      FROM seeded
    RETURNING id, created_at, finished_at
), task AS (
    INSERT INTO tasks (run_id, key, executor_kind, action, unfinished_deps, state, attempts,
                       max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
                       timeout_ms, output, ready_at, finished_at)
    SELECT run.id, 't' || k, 'mock', 'noop', 0, 'succeeded', 1, 3, 0, 1000, 2, 60000,
           jsonb_build_object('task', 't' || k), run.created_at, run.finished_at
      FROM run, generate_series(0, $2::int - 1) AS k
    RETURNING id, run_id, finished_at
), dispatch AS (
    INSERT INTO dispatches (run_id, task_id, executor_kind, state, created_at, worker_id,
                            lease_token_hash, fencing_token, leased_at, lease_expires_at,
                            attempt_deadline, result_hash, finished_at)
    SELECT run_id, id, 'mock', 'completed', finished_at - interval '2 seconds', $4,
           sha256(id::text::bytea), nextval('fencing_tokens'),
           finished_at - interval '1 second', finished_at + interval '14 seconds',
           finished_at + interval '59 seconds', sha256(run_id::text::bytea), finished_at
      FROM task
    RETURNING id, run_id, task_id, worker_id, fencing_token, leased_at, attempt_deadline,
              finished_at
), attempt AS (
    INSERT INTO attempts (task_id, run_id, attempt, dispatch_id, worker_id, fencing_token,
                          state, started_at, deadline, finished_at)
    SELECT task_id, run_id, 1, id, worker_id, fencing_token, 'succeeded', leased_at,
           attempt_deadline, finished_at
      FROM dispatch
), event AS (
    INSERT INTO state_events (run_id, seq, revision, type, task_key, from_state, to_state,
                              created_at)
    SELECT run.id, seq, seq,
           CASE WHEN seq = 1 OR seq = last THEN 'run.state' ELSE 'task.state' END,
           CASE WHEN seq IN (1, last) THEN NULL ELSE 't' || (seq - 2) / 4 END,
           CASE WHEN seq = 1 THEN NULL WHEN seq = last THEN 'running'
                ELSE (ARRAY['pending', 'ready', 'queued', 'running'])[(seq - 2) % 4 + 1] END,
           CASE WHEN seq = 1 THEN 'running' WHEN seq = last THEN $6
                ELSE (ARRAY['ready', 'queued', 'running', 'succeeded'])[(seq - 2) % 4 + 1] END,
           run.finished_at
      FROM run,
           LATERAL (SELECT $7::int + $8::int * $2::int AS last) AS n,
           generate_series(1, n.last) AS seq
)
SELECT count(*) FROM run
"""


@dataclass(frozen=True, slots=True)
class Backlog:
    """What seed() made: runs, and rows per table including the runs."""

    runs: int
    rows: int


async def seed(
    db: Conn | Pool,
    runs: int,
    *,
    tasks: int = 3,
    finished_ago_s: float = 40 * 86400,
    state: str = "succeeded",
) -> Backlog:
    """`runs` finished runs of `tasks` tasks each; the newest finished finished_ago_s ago,
    the others a millisecond apart before it."""
    ids = await db.fetchrow(_FIXTURES, WORKFLOW)
    assert ids is not None
    # In chunks: one statement stays well inside any client's command timeout on a busy
    # machine. Each chunk is older than the one before, a millisecond apart throughout.
    for first in range(0, runs, CHUNK_RUNS):
        count = min(CHUNK_RUNS, runs - first)
        made = await db.fetchval(
            _SEED,
            count,
            tasks,
            finished_ago_s + first / 1000,
            ids["worker_id"],
            ids["workflow_id"],
            state,
            RUN_EVENTS,
            TASK_EVENTS,
        )
        assert made == count
    per_run = 1 + tasks * 3 + RUN_EVENTS + TASK_EVENTS * tasks
    return Backlog(runs, runs * per_run)


async def run_ids(db: Conn | Pool) -> set[UUID]:
    """The seeded runs still stored."""
    rows = await db.fetch("SELECT id FROM runs WHERE started_by = 'backlog'")
    return {row["id"] for row in rows}
