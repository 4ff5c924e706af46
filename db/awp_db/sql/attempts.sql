-- What failed attempts keep beyond their error (migration 0007), and the reads of it.

-- name: page
-- A run's attempts (of the task $2 only, unless NULL), oldest first, after the attempt id
-- $3 (keyset paging), at most $4.
SELECT a.id, t.key AS task_key, a.attempt, a.state, a.worker_id, w.name AS worker_name,
       a.dispatch_id, a.fencing_token, a.started_at, a.deadline, a.finished_at, a.error,
       a.traceback, a.log_tail
  FROM attempts a
  JOIN tasks t ON t.id = a.task_id
  JOIN workers w ON w.id = a.worker_id
 WHERE a.run_id = $1 AND ($2::text IS NULL OR t.key = $2) AND a.id > $3
 ORDER BY a.id
 LIMIT $4

-- name: final_tracebacks
-- The traceback of the last attempt of each of the tasks $2 that failed, where it kept one.
SELECT t.key, a.traceback
  FROM tasks t
  JOIN attempts a ON a.task_id = t.id AND a.attempt = t.attempts
 WHERE t.run_id = $1 AND t.id = ANY($2::bigint[]) AND t.state = 'failed'
   AND a.traceback IS NOT NULL

-- name: has_task
SELECT EXISTS (SELECT 1 FROM tasks WHERE run_id = $1 AND key = $2)
