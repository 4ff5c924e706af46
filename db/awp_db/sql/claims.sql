-- Claim: leasing pending dispatches to free slots (DESIGN.md §4, §6).

-- name: take
-- One statement leases up to :slots dispatches of the runs :run_ids (locked already:
-- locks.sql claimable_runs), creates their attempts and moves their tasks queued -> running.
-- Dispatch rows another transaction holds (e.g. being canceled) are skipped, never
-- waited for, so the lock order holds. FOR UPDATE, not the order's FOR NO KEY UPDATE:
-- leasing rewrites fencing_token, a unique (key) column, which takes that strength
-- anyway; nothing references a pending dispatch, so no foreign-key check waits for it.
-- :slot_workers/:token_digests: one entry per slot offered, its worker and its lease
-- token's digest; the n-th dispatch picked goes to the n-th slot (slots of several
-- sessions whose rows this transaction locked may be listed one session after the other).
-- Upstream outputs too large to travel inline are left out: the server lists them in
-- the lease (omitted_upstream_keys) and the worker fetches them (upstream.sql).
-- Placement (migration 0020): :chosen NULL takes only dispatches without placement
-- (`placed` false); otherwise exactly the dispatches :chosen, which awp_db.placement
-- matched to the slots, the n-th of :chosen to the n-th slot.
WITH picked AS (
    SELECT d.id, d.run_id, d.task_id
      FROM dispatches d
     WHERE d.state = 'pending' AND d.executor_kind = ANY(:kinds::text[]) AND d.run_id = ANY(:run_ids::uuid[])
       AND CASE WHEN :chosen::bigint[] IS NULL THEN NOT d.placed ELSE d.id = ANY(:chosen::bigint[]) END
     -- Oldest first; "+ 0" keeps PostgreSQL from walking the primary key (every dispatch
     -- ever made) in id order, filtering: the few pending ones come from their partial
     -- index and are sorted.
     ORDER BY d.id + 0
     LIMIT :slots
       FOR UPDATE SKIP LOCKED
), sized AS (
    -- The leases' inputs, as JSON text (never shorter than canonical JSON), so far.
    SELECT p.*, octet_length(t.input::text) + octet_length(r.input::text) AS own,
           sum(octet_length(t.input::text) + octet_length(r.input::text)) OVER (ORDER BY p.id) AS through
      FROM picked p JOIN tasks t ON t.id = p.task_id JOIN runs r ON r.id = p.run_id
), numbered AS (
    -- Only as many as one answer can deliver (:max_input_bytes:
    -- limits.MAX_CLAIM_INPUT_JSON_BYTES); the first always. The rest stay pending, locked by nobody once this commits.
    SELECT s.id, s.run_id, s.task_id,
           coalesce(array_position(:chosen::bigint[], s.id), row_number() OVER (ORDER BY s.id)) AS n
      FROM sized s WHERE s.through <= :max_input_bytes OR s.through = s.own
), leased AS (
    UPDATE dispatches d
       SET state = 'leased',
           worker_id = tk.worker_id,
           lease_token_hash = tk.hash,
           fencing_token = nextval('fencing_tokens'),
           leased_at = statement_timestamp(),
           attempt_deadline = statement_timestamp() + t.timeout_ms * interval '1 millisecond',
           lease_expires_at = statement_timestamp() + least(:lease_ttl_ms::bigint, t.timeout_ms) * interval '1 millisecond'
      FROM numbered nb
      JOIN unnest(:token_digests::bytea[], :slot_workers::uuid[]) WITH ORDINALITY
           AS tk (hash, worker_id, n) ON tk.n = nb.n
      JOIN tasks t ON t.id = nb.task_id
     WHERE d.id = nb.id
 RETURNING d.id, d.run_id, d.task_id, d.worker_id, d.fencing_token, d.lease_expires_at,
           d.attempt_deadline, d.leased_at, tk.n
), started AS (
    UPDATE tasks t
       SET state = 'running', attempts = t.attempts + 1
      FROM leased l
     WHERE t.id = l.task_id AND t.state = 'queued'
 -- A free hand-back (migration 0009) or suspension (0016) moves the last attempt's number up by one.
 RETURNING t.id, t.key, t.attempts, t.max_attempts + t.hand_backs + t.suspensions AS max_attempts, t.action,
           t.input, t.executor_kind, t.depends_on, t.ready_at
), recorded AS (
    INSERT INTO attempts (task_id, run_id, attempt, dispatch_id, worker_id, fencing_token, started_at, deadline)
    SELECT l.task_id, l.run_id, s.attempts, l.id, l.worker_id, l.fencing_token, statement_timestamp(), l.attempt_deadline
      FROM leased l JOIN started s ON s.id = l.task_id
)
SELECT l.id AS dispatch_id, l.n AS token_index, l.run_id, l.worker_id, s.key AS task_key, s.executor_kind,
       s.action, s.input, s.attempts AS attempt, s.max_attempts, l.fencing_token,
       l.lease_expires_at, l.attempt_deadline,
       extract(epoch FROM l.lease_expires_at - statement_timestamp()) * 1000 AS lease_remaining_ms,
       extract(epoch FROM l.attempt_deadline - statement_timestamp()) * 1000 AS attempt_remaining_ms,
       r.input AS run_input, s.depends_on, up.upstream_outputs, up.upstream_states,
       -- The run's trace (NULL: not traced) and the task's wait, ready -> leased.
       r.trace_id, r.trace_span, s.ready_at, l.leased_at
  FROM leased l
  JOIN started s ON s.id = l.task_id
  JOIN runs r ON r.id = l.run_id
  -- Each upstream task found by its (run_id, key) index entry: filtering the run's tasks
  -- by "key = ANY(depends_on)" instead made PostgreSQL 15 read every task of the run
  -- for every lease (measured: 4 of the 5 ms a claim of 8 took in a run of 1,000).
  LEFT JOIN LATERAL (
      SELECT -- Larger outputs (:max_inline_output_bytes:
             -- limits.MAX_INLINE_OUTPUT_JSON_BYTES) are fetched on their own.
             jsonb_object_agg(u.key, coalesce(u.output, '{}'::jsonb))
                 FILTER (WHERE coalesce(octet_length(u.output::text), 0) <= :max_inline_output_bytes) AS upstream_outputs,
             -- All succeeded, unless the task is an always task.
             jsonb_object_agg(u.key, u.state) AS upstream_states
        FROM unnest(s.depends_on) AS upstream (key)
        JOIN tasks u ON u.run_id = l.run_id AND u.key = upstream.key
  ) up ON true
 ORDER BY l.id
