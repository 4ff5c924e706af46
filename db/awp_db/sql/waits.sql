-- Waits, signals and approvals (docs/design.md §16). Every statement here runs under
-- the lock of the task's run (awp_db.locks), so a wait, the signals of its run and the
-- decision on it never change under another writer: a signal is consumed by one wait,
-- a wait consumes one signal.

-- name: checkpoint
-- The checkpoint of task $1 under (kind $2, name $3, occurrence $4), if stored.
SELECT kind, name, occurrence, value::text AS value_json, tokens, cost_usd, timed_out,
       coalesce(attempt, 0) AS attempt, 1 AS available
  FROM checkpoints
 WHERE task_id = $1 AND kind = $2 AND name = $3 AND occurrence = $4

-- name: take_signal
-- The oldest signal of run $1 named $2 not consumed yet, now consumed by task $3.
UPDATE signals s
   SET consumed_by_task = $3, consumed_at = clock_timestamp()
 WHERE s.id = (SELECT id FROM signals
                WHERE run_id = $1 AND name = $2 AND consumed_at IS NULL
                ORDER BY id LIMIT 1)
RETURNING s.id, s.payload::text AS payload_json

-- name: suspend
-- The attempt of the leased dispatch :dispatch_id reached a wait not yet satisfied: the
-- lease ends as a hand-back's does (`expired`: a late result is LEASE_LOST, and the
-- revocation trigger of migration 0012 tells the holder's stream, so its heartbeat
-- drops it at once), the attempt is SUSPENDED, the
-- task WAITING for it (suspensions + 1: free of charge), and what the attempt replayed
-- is added to the task's savings. Returns the wait's due time on the database clock.
WITH ended_dispatch AS (
    UPDATE dispatches SET state = 'expired', finished_at = clock_timestamp()
     WHERE id = :dispatch_id AND state = 'leased'
 RETURNING id, task_id
), ended_attempt AS (
    UPDATE attempts SET state = 'suspended', finished_at = clock_timestamp()
     WHERE dispatch_id = (SELECT id FROM ended_dispatch) AND state = 'running'
)
UPDATE tasks t
   SET state = 'waiting', suspensions = t.suspensions + 1,
       wait_kind = :kind, wait_name = :name, wait_occurrence = :occurrence,
       wait_prompt = :prompt, wait_role = :role, wait_since = clock_timestamp(),
       wait_due_at = clock_timestamp() + :due_in_ms::bigint * interval '1 millisecond',
       wait_attempt = :attempt,
       saved_steps = t.saved_steps + :saved_steps,
       saved_tokens = t.saved_tokens + :saved_tokens,
       saved_cost_usd = t.saved_cost_usd + :saved_cost_usd
  FROM ended_dispatch e
 WHERE t.id = e.task_id AND t.state = 'running'
RETURNING t.wait_due_at

-- name: suspended_here
-- Whether task $1 still waits at the wait (kind $2, name $3, occurrence $4) that its
-- attempt $5 suspended at: a resent Await whose SUSPENDED answer was lost.
SELECT EXISTS (
  SELECT 1 FROM tasks
   WHERE id = $1 AND state = 'waiting' AND wait_attempt = $5
     AND wait_kind = $2 AND wait_name = $3 AND wait_occurrence = $4)

-- name: waiting_task
-- Run $1's oldest task waiting for (kind $2, name $3) (a task key $4 when not NULL).
SELECT id, run_id, key, wait_kind, wait_name, wait_occurrence, wait_role,
       coalesce(wait_attempt, 0) AS wait_attempt, wait_task IS NOT NULL AS wait_task,
       wait_due_at, wait_since
  FROM tasks
 WHERE run_id = $1 AND state = 'waiting' AND wait_kind = $2
   AND ($3::text IS NULL OR wait_name = $3) AND ($4::text IS NULL OR key = $4)
 ORDER BY wait_since, id
 LIMIT 1
   FOR NO KEY UPDATE

-- name: task_by_key
SELECT id, state FROM tasks WHERE run_id = $1 AND key = $2

-- name: resume
-- Task $1 leaves WAITING: READY to run again (its wait's checkpoint is stored). Returns
-- when, and its run's trace (NULLs: untraced), for the wait's span.
UPDATE tasks t SET state = 'ready', ready_at = clock_timestamp()
  FROM runs r
 WHERE t.id = $1 AND t.state = 'waiting' AND r.id = t.run_id
RETURNING t.ready_at AS resumed_at, r.trace_id, r.trace_span

-- name: signal_by_request
-- The signal a request id sent already, and the task that consumed it, if any.
SELECT s.id, coalesce(t.key, '') AS delivered_to
  FROM signals s LEFT JOIN tasks t ON t.id = s.consumed_by_task
 WHERE s.run_id = $1 AND s.request_id = $2

-- name: insert_signal
INSERT INTO signals (run_id, name, payload, request_id, sent_by)
VALUES ($1, $2, $3::text::jsonb, $4, $5)
RETURNING id

-- name: due_waits
-- Waits whose time has come (a sleep's end, a wait's timeout), unlocked (index
-- tasks_wait_due).
SELECT id, run_id FROM tasks
 WHERE state = 'waiting' AND wait_due_at <= clock_timestamp()
 ORDER BY wait_due_at
 LIMIT $1

-- name: lock_due_waits
-- Of the tasks $1, those of the runs $2 (locked by the caller, running) still waiting
-- and due, locked.
SELECT id, run_id, key, wait_kind, wait_name, wait_occurrence, wait_role,
       coalesce(wait_attempt, 0) AS wait_attempt, wait_task IS NOT NULL AS wait_task,
       wait_due_at, wait_since
  FROM tasks
 WHERE id = ANY($1::bigint[]) AND run_id = ANY($2::uuid[])
   AND state = 'waiting' AND wait_due_at <= clock_timestamp()
 ORDER BY id
   FOR NO KEY UPDATE

-- name: clock
SELECT clock_timestamp()

-- name: ready_wait_tasks
-- Wait tasks that became ready (index tasks_wait_ready), unlocked.
SELECT id, run_id FROM tasks
 WHERE state = 'ready' AND wait_task IS NOT NULL
 ORDER BY id
 LIMIT $1

-- name: start_wait_tasks
-- Of the tasks $1, the wait tasks of the runs $2 (locked by the caller, running) still
-- ready: WAITING at once, due when their sleep ends or their approval times out. $3 is
-- the name an approval task's wait takes.
UPDATE tasks
   SET state = 'waiting', wait_kind = wait_task->>'kind',
       wait_name = CASE WHEN wait_task->>'kind' = 'approval' THEN $3 ELSE '' END,
       wait_occurrence = 0, wait_prompt = wait_task->>'prompt',
       wait_role = nullif(wait_task->>'role', ''), wait_since = clock_timestamp(),
       wait_due_at = clock_timestamp()
           + coalesce(wait_task->>'sleep_ms', wait_task->>'timeout_ms')::bigint
             * interval '1 millisecond'
 WHERE id = ANY($1::bigint[]) AND run_id = ANY($2::uuid[])
   AND state = 'ready' AND wait_task IS NOT NULL
RETURNING run_id, key, wait_kind, wait_due_at

-- name: end_wait_task
-- Wait task $1 ends for good: $2 (succeeded or failed), with output $3 or error $4;
-- returned as awp_db.dynamic.Finished.
UPDATE tasks
   SET state = $2, output = $3::text::jsonb, error = $4::text::jsonb,
       finished_at = clock_timestamp()
 WHERE id = $1 AND state = 'waiting'
RETURNING id, run_id, key, state, dependents, parent_id, map_index, on_failure, always, error
