-- What the coordinator exports as spans about runs (awp_db.traces, docs/observability.md).

-- name: ended_attempts
-- The attempts of these leases (just settled by the reaper or an offline worker's
-- interruption) in traced runs, with how their lease ended.
SELECT a.run_id, t.key AS task_key, a.attempt, a.worker_id, a.fencing_token, a.dispatch_id,
       a.state, a.started_at, a.finished_at, d.lease_expires_at, r.trace_id, r.trace_span
  FROM attempts a
  JOIN runs r ON r.id = a.run_id
  JOIN tasks t ON t.id = a.task_id
  JOIN dispatches d ON d.id = a.dispatch_id
 WHERE a.dispatch_id = ANY($1::bigint[]) AND r.trace_id IS NOT NULL AND a.finished_at IS NOT NULL
 ORDER BY a.dispatch_id
