-- Settlement: how an attempt's end, a run's failure or its cancellation are written.
-- Every statement here runs with the affected runs and dispatches already locked
-- (locks.sql, which states the lock order).

-- name: end_attempts
-- Ends each attempt with its dispatch and applies the retry decision to its task, in
-- one statement. One entry per ending in each parameter; :tracebacks and :log_tails hold
-- a failure's traceback and log tail (NULL for none; migration 0007), written
-- here rather than by a second UPDATE of the attempt, which PostgreSQL would check
-- against the attempt's foreign keys again, locking its worker's row (awp_db.locks).
-- A task keeps the output only of a success (the one place an output is stored), and
-- its error only while it has not
-- succeeded: a later attempt's success clears an earlier one's error, which stays on that
-- attempt (clients show a task's error as its last attempt's). A task sent back to `ready` was handed back
-- free of charge (awp_kernel.retry.decide_hand_back): it counts one more free hand-back.
-- What the attempt replayed from step memos (:saved_*) adds to its task's savings.
-- Runs and dispatches are locked by the caller, so no other writer touches these
-- attempts and tasks meanwhile.
-- Returns each task, as awp_db.dynamic.Finished, and whether its run may have finished:
-- no live task left besides the ones this statement ended for good (`l` is read as of
-- the statement's start, when those were still running; a task now waiting for a retry
-- stays live) and always tasks waiting for their turn (awp_db.dynamic).
WITH e AS (
    SELECT *
      FROM unnest(:dispatch_ids::bigint[], :dispatch_states::text[], :result_hashes::bytea[],
                  :attempt_states::text[], :outputs::text[], :errors::text[], :task_ids::bigint[],
                  :task_states::text[], :retry_in_ms::bigint[], :tracebacks::text[],
                  :log_tails::text[], :saved_steps::int[], :saved_tokens::bigint[],
                  :saved_cost_usd::float8[])
           AS e (dispatch_id, dispatch_state, result_hash, attempt_state, output, error,
                 task_id, task_state, retry_in_ms, traceback, log_tail, saved_steps,
                 saved_tokens, saved_cost_usd)
), ended_dispatches AS (
    UPDATE dispatches d
       SET state = e.dispatch_state, result_hash = e.result_hash, finished_at = clock_timestamp()
      FROM e
     WHERE d.id = e.dispatch_id AND d.state = 'leased'
), ended_attempts AS (
    -- The output is stored once, on the task (migration 0022): the attempt that
    -- succeeded is the one whose dispatch holds the accepted result's hash.
    UPDATE attempts a
       SET state = e.attempt_state, finished_at = clock_timestamp(),
           error = e.error::jsonb,
           traceback = CASE WHEN e.attempt_state = 'failed' THEN e.traceback END,
           log_tail = CASE WHEN e.attempt_state = 'failed' THEN e.log_tail END
      FROM e
     WHERE a.dispatch_id = e.dispatch_id AND a.state = 'running'
), ended_tasks AS (
    UPDATE tasks t
       SET state = e.task_state,
           output = coalesce(CASE WHEN e.task_state = 'succeeded' THEN e.output::jsonb END, t.output),
           error = CASE WHEN e.task_state = 'succeeded' THEN NULL
                        ELSE coalesce(e.error::jsonb, t.error) END,
           retry_at = CASE WHEN e.task_state = 'waiting_retry'
                           THEN clock_timestamp() + e.retry_in_ms * interval '1 millisecond' END,
           finished_at = CASE WHEN e.task_state IN ('succeeded', 'failed') THEN clock_timestamp() END,
           hand_backs = t.hand_backs + (e.task_state = 'ready')::int,
           saved_steps = t.saved_steps + e.saved_steps,
           saved_tokens = t.saved_tokens + e.saved_tokens,
           saved_cost_usd = t.saved_cost_usd + e.saved_cost_usd,
           ready_at = CASE WHEN e.task_state = 'ready' THEN clock_timestamp() ELSE t.ready_at END
      FROM e
     WHERE t.id = e.task_id AND t.state = 'running'
 RETURNING t.id, t.run_id, t.key, t.state, t.dependents, t.parent_id, t.map_index,
           t.on_failure, t.always, t.error
), finishing AS (
    SELECT r.run_id
      FROM (SELECT DISTINCT run_id FROM ended_tasks) r
     WHERE NOT EXISTS (
           SELECT 1 FROM tasks l
            WHERE l.run_id = r.run_id
              AND l.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting')
              AND NOT (l.always AND l.state = 'pending')
              AND l.id NOT IN (SELECT id FROM ended_tasks WHERE state IN ('succeeded', 'failed')))
)
SELECT x.*, x.run_id IN (SELECT run_id FROM finishing) AS run_may_finish
  FROM ended_tasks x

-- name: unlock_dependents
-- $1/$2: (run, dependent key) once per succeeded dependency; a task becomes ready when
-- its last unfinished dependency succeeds -- a map task running instead: its elements
-- are created next (awp_db.dynamic.start_maps), and they are what is dispatched.
WITH done AS (
    SELECT run_id, key, count(*) AS n
      FROM unnest($1::uuid[], $2::text[]) AS x (run_id, key)
     GROUP BY run_id, key
)
UPDATE tasks t
   SET unfinished_deps = t.unfinished_deps - done.n,
       state = CASE WHEN t.unfinished_deps - done.n > 0 THEN t.state
                    WHEN t.map_over IS NULL THEN 'ready'
                    ELSE 'running' END,
       ready_at = CASE WHEN t.unfinished_deps - done.n = 0 THEN clock_timestamp() END
  FROM done
 WHERE t.run_id = done.run_id AND t.key = done.key AND t.state = 'pending'
RETURNING t.id, t.run_id, t.key, t.state

-- name: cancel_live_dispatches
-- The runs are locked (by the caller), so whoever else waits for these rows waits
-- for the runs first; heartbeats, which lock leases without their run, never wait for
-- one while holding another (awp_db.locks). Id order all the same.
WITH live AS (
    SELECT id FROM dispatches
     WHERE run_id = ANY($1::uuid[]) AND state IN ('pending', 'leased')
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE dispatches d
   SET state = 'canceled', finished_at = clock_timestamp()
  FROM live
 WHERE d.id = live.id
RETURNING d.id

-- name: cancel_running_attempts
UPDATE attempts a
   SET state = 'canceled', finished_at = clock_timestamp()
  FROM tasks t
 WHERE a.run_id = ANY($1::uuid[]) AND a.state = 'running' AND t.id = a.task_id
RETURNING a.run_id, t.key, a.attempt

-- name: stop_tasks
-- Running tasks are canceled (their attempt was stopped); untouched ones take $2.
-- Always tasks too only when $3 (a cancel; a failing run still runs them).
-- The task rows are locked under their runs' locks, which the caller holds.
WITH live AS (
    SELECT id, state FROM tasks
     WHERE run_id = ANY($1::uuid[])
       AND state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting')
       AND ($3::bool OR NOT always)
       FOR NO KEY UPDATE
)
UPDATE tasks t
   SET state = CASE WHEN live.state = 'running' THEN 'canceled' ELSE $2 END,
       retry_at = NULL, finished_at = clock_timestamp()
  FROM live
 WHERE t.id = live.id
RETURNING t.run_id, t.key, live.state AS from_state, t.state AS to_state

-- name: finished_runs
-- Runs still marked running whose tasks are all terminal, with the states that decide
-- their outcome (awp_kernel.states.run_outcome): those of the always tasks apart.
SELECT r.id,
       coalesce(array_agg(DISTINCT t.state) FILTER (WHERE NOT t.always), '{}') AS task_states,
       coalesce(array_agg(DISTINCT t.state) FILTER (WHERE t.always), '{}') AS always_states
  FROM runs r JOIN tasks t ON t.run_id = r.id
 WHERE r.id = ANY($1::uuid[]) AND r.state = 'running'
   AND NOT EXISTS (
       SELECT 1 FROM tasks l
        WHERE l.run_id = r.id
          AND l.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting'))
 GROUP BY r.id

-- name: finish_runs
-- Each run $1[i] still running ends with the outcome $2[i], in one statement for all the
-- runs a transaction finishes (a batch of single-task runs finishes one per task).
UPDATE runs r SET state = f.outcome, finished_at = clock_timestamp()
  FROM unnest($1::uuid[], $2::text[]) AS f (id, outcome)
 WHERE r.id = f.id AND r.state = 'running'
RETURNING r.id
