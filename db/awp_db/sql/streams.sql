-- Output streams (docs/design.md §15): fenced appends, and reads in position order.

-- name: lock_lease
-- The writer's dispatch locked (the reaper, renewals and settlement need this lock too,
-- so the lease cannot end while an append is judged), with the attempt it is and the
-- live clock read after the lock (as locks.sql dispatches_for_settlement).
SELECT locked.*, clock_timestamp() AS now
  FROM (SELECT d.id, d.run_id, d.task_id, d.state, d.worker_id, d.lease_token_hash,
               d.result_hash, d.lease_expires_at, d.attempt_deadline, a.attempt
          FROM dispatches d
          JOIN attempts a ON a.dispatch_id = d.id
         WHERE d.id = $1
           FOR UPDATE OF d) AS locked

-- name: tail
-- The attempt's last stored chunk: the next offset and the bytes written so far.
SELECT chunk_offset, total_bytes FROM stream_chunks
 WHERE dispatch_id = $1 ORDER BY chunk_offset DESC LIMIT 1

-- name: stored
-- Chunks already stored at the offsets a (re)sent batch covers.
SELECT chunk_offset, data, is_json FROM stream_chunks
 WHERE dispatch_id = $1 AND chunk_offset >= $2 AND chunk_offset < $3
 ORDER BY chunk_offset

-- name: base
-- Where the attempt starts in the task's stream: at its first chunk if stored, else
-- after every chunk of the task's earlier attempts (frozen: their leases have ended).
SELECT coalesce(
    (SELECT position FROM stream_chunks WHERE dispatch_id = $1 AND chunk_offset = 0),
    (SELECT max(position) + 1 FROM stream_chunks WHERE task_id = $2),
    0)

-- name: insert
INSERT INTO stream_chunks
       (dispatch_id, chunk_offset, run_id, task_id, attempt, position, data, is_json, total_bytes)
SELECT $1, c.chunk_offset, $2, $3, $4, $5 + c.chunk_offset, c.data, c.is_json, c.total_bytes
  FROM unnest($6::bigint[], $7::text[], $8::boolean[], $9::bigint[])
       AS c (chunk_offset, data, is_json, total_bytes)

-- name: task
SELECT t.id, t.state FROM tasks t WHERE t.run_id = $1 AND t.key = $2

-- name: attempts
-- The task's attempts in order, with how each ended (NULL while running).
SELECT attempt, state, finished_at IS NOT NULL AS ended,
       error ->> 'message' AS error_message
  FROM attempts WHERE task_id = $1 ORDER BY attempt

-- name: chunks
SELECT position, attempt, chunk_offset, data, is_json FROM stream_chunks
 WHERE task_id = $1 AND position >= $2 ORDER BY position LIMIT $3

-- name: attempt_at
SELECT attempt FROM stream_chunks WHERE task_id = $1 AND position = $2

-- name: notify
SELECT pg_notify($1, $2)
