-- RetryRun: a new run of a finished run's workflow version and input that reuses what
-- succeeded (awp_db.retry; the rule is awp_kernel.resume).

-- name: by_request_id
SELECT id, retried_from, retry_from_task FROM runs WHERE request_id = $1

-- name: source
-- The run to retry and its workflow; the caller holds the run's lock (locks.sql: runs).
SELECT r.input, w.id AS workflow_id, w.definition
  FROM runs r JOIN workflows w ON w.id = r.workflow_id
 WHERE r.id = $1

-- name: succeeded_keys
SELECT key FROM tasks WHERE run_id = $1 AND state = 'succeeded'

-- name: insert
-- Returns nothing when request_id was already used (the caller fetches that run). It
-- keeps the retried run's priority.
INSERT INTO runs (workflow_id, input, concurrency, request_id, started_by, retried_from,
                  retry_from_task, priority)
SELECT $1, $2, $3, $4, $5, $6, $7, r.priority FROM runs r WHERE r.id = $6
ON CONFLICT (request_id) DO NOTHING
RETURNING id

-- name: reuse_tasks
-- The tasks $3 of the new run $1, just created, take the output of the same task of the
-- source run $2 and end SUCCEEDED without an attempt, naming the run whose attempt
-- produced that output: a task the source itself reused names where it came from.
UPDATE tasks t
   SET state = 'succeeded', output = s.output,
       reused_from_run_id = coalesce(s.reused_from_run_id, s.run_id),
       unfinished_deps = 0, ready_at = NULL, finished_at = clock_timestamp()
  FROM tasks s
 WHERE t.run_id = $1 AND t.key = ANY($3::text[])
   AND s.run_id = $2 AND s.key = t.key AND s.state = 'succeeded'
RETURNING t.id, t.run_id, t.key, t.state, t.dependents, t.parent_id, t.map_index, t.on_failure,
          t.always, t.error, t.reused_from_run_id
