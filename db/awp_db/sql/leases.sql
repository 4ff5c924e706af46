-- Leases: claiming dispatches, renewing them, and fencing results (DESIGN.md §4, §6).

-- name: claimable_runs
-- Runs that own the oldest pending dispatches this worker can run, locked in ascending
-- id (ORDER BY is applied before FOR UPDATE). Waiting here, rather than skipping a
-- locked run, keeps concurrent claimers of one busy run from coming back empty.
-- A claim the first round left short runs it again with SKIP LOCKED appended
-- (leases.claim_many): whatever other runs are free now, never waiting; runs this
-- transaction already locked are returned again.
SELECT r.id
  FROM runs r
 WHERE r.id IN (SELECT d.run_id
                  FROM dispatches d
                 WHERE d.state = 'pending' AND d.executor_kind = ANY($1::text[])
                 ORDER BY d.id + 0  -- see take
                 LIMIT $2)
   AND r.state = 'running' AND r.cancel_requested_at IS NULL
 ORDER BY r.id
   FOR UPDATE

-- name: take
-- One statement leases up to $4 dispatches of the locked runs $3, creates their
-- attempts and moves their tasks queued -> running. Dispatch rows another
-- transaction holds (e.g. being canceled) are skipped, never waited for.
-- $1/$5: one entry per slot offered, its worker and its lease token's digest; the
-- n-th dispatch picked goes to the n-th slot (slots of several sessions whose rows
-- this transaction locked may be listed one session after the other).
WITH picked AS (
    SELECT d.id, d.run_id, d.task_id
      FROM dispatches d
     WHERE d.state = 'pending' AND d.executor_kind = ANY($2::text[]) AND d.run_id = ANY($3::uuid[])
     -- Oldest first; "+ 0" keeps PostgreSQL from walking the primary key (every dispatch
     -- ever made) in id order, filtering: the few pending ones come from their partial
     -- index and are sorted.
     ORDER BY d.id + 0
     LIMIT $4
       FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT p.*, row_number() OVER (ORDER BY p.id) AS n FROM picked p
), leased AS (
    UPDATE dispatches d
       SET state = 'leased',
           worker_id = tk.worker_id,
           lease_token_hash = tk.hash,
           fencing_token = nextval('fencing_tokens'),
           leased_at = statement_timestamp(),
           attempt_deadline = statement_timestamp() + t.timeout_ms * interval '1 millisecond',
           lease_expires_at = statement_timestamp() + least($6::bigint, t.timeout_ms) * interval '1 millisecond'
      FROM numbered nb
      JOIN unnest($5::bytea[], $1::uuid[]) WITH ORDINALITY AS tk (hash, worker_id, n) ON tk.n = nb.n
      JOIN tasks t ON t.id = nb.task_id
     WHERE d.id = nb.id
 RETURNING d.id, d.run_id, d.task_id, d.worker_id, d.fencing_token, d.lease_expires_at,
           d.attempt_deadline, tk.n
), started AS (
    UPDATE tasks t
       SET state = 'running', attempts = t.attempts + 1
      FROM leased l
     WHERE t.id = l.task_id AND t.state = 'queued'
 RETURNING t.id, t.key, t.attempts, t.max_attempts, t.action, t.input, t.executor_kind,
           t.depends_on
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
       r.input AS run_input,
       (SELECT jsonb_object_agg(u.key, coalesce(u.output, '{}'::jsonb))
          FROM tasks u
         WHERE u.run_id = l.run_id AND u.key = ANY(s.depends_on)) AS upstream_outputs
  FROM leased l
  JOIN started s ON s.id = l.task_id
  JOIN runs r ON r.id = l.run_id
 ORDER BY l.id

-- name: lease_digests
-- Unlocked read: a dispatch's token digest and holder never change once leased.
SELECT id, run_id, worker_id, state, lease_token_hash
  FROM dispatches WHERE id = ANY($1::bigint[])

-- name: renew
-- Validity is re-checked under the row lock against the live clock, so a renewal and
-- a reaper settling the same lease can never both win.
UPDATE dispatches d
   SET lease_expires_at = least(clock_timestamp() + $3 * interval '1 millisecond', d.attempt_deadline)
 WHERE d.id = ANY($2::bigint[]) AND d.worker_id = $1 AND d.state = 'leased'
   AND d.lease_expires_at > clock_timestamp() AND d.attempt_deadline > clock_timestamp()
RETURNING d.id, d.lease_expires_at,
          extract(epoch FROM d.lease_expires_at - clock_timestamp()) * 1000 AS lease_remaining_ms,
          extract(epoch FROM d.attempt_deadline - clock_timestamp()) * 1000 AS attempt_remaining_ms

-- name: shorten
-- The worker's heartbeat stream broke: its leases now expire after the stream grace.
UPDATE dispatches
   SET lease_expires_at = least(lease_expires_at, clock_timestamp() + $2 * interval '1 millisecond')
 WHERE worker_id = $1 AND state = 'leased'
RETURNING id

-- name: lock_runs_of
-- The runs of the dispatches named, locked in ascending id (ORDER BY is applied before
-- FOR UPDATE): the first step of every settlement (lock order: runs, then dispatches).
-- A dispatch's run never changes, so the unlocked subquery is safe.
SELECT id FROM runs
 WHERE id IN (SELECT run_id FROM dispatches WHERE id = ANY($1::bigint[]))
 ORDER BY id
   FOR UPDATE

-- name: lock_for_settlement
-- The dispatches named, with their attempt and task, locked (runs already are), and the
-- live clock read after each row is locked (the subquery carries FOR UPDATE, so
-- PostgreSQL never flattens it and the outer projection runs above the row lock). A
-- result is judged against that clock while its lease can no longer change: renewing,
-- shortening and reaping it all need this row's lock.
SELECT locked.*, clock_timestamp() AS now
  FROM (SELECT d.id, d.run_id, d.task_id, d.state, d.worker_id, d.lease_token_hash,
               d.result_hash, d.lease_expires_at, d.attempt_deadline,
               a.attempt, t.key AS task_key, t.dependents, t.max_attempts,
               t.backoff_initial_ms, t.backoff_max_ms, t.backoff_multiplier
          FROM dispatches d
          JOIN tasks t ON t.id = d.task_id
          LEFT JOIN attempts a ON a.dispatch_id = d.id
         WHERE d.id = ANY($1::bigint[])
         ORDER BY d.id
           FOR UPDATE OF d) AS locked

-- name: worker_leases
SELECT id, run_id FROM dispatches WHERE worker_id = ANY($1::uuid[]) AND state = 'leased'
