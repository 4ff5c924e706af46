-- Every query that takes row locks, run by awp_db.locks, whose docstring states the
-- one lock order they follow. ORDER BY is applied before the locking clause, so each
-- query below locks its rows in ascending id; one that skips locked rows never waits.
-- Every lock is FOR NO KEY UPDATE (awp_db.locks: the foreign-key checks' FOR KEY SHARE
-- never waits for it), but retention's, which deletes its rows.

-- name: session
-- One session's row: serialises its claims (so its free slots cannot be exceeded),
-- its drain and the loss of its heartbeat stream.
SELECT id, state, session_token_hash, executor_kinds, max_concurrency, stream_epoch,
       placement_labels, resource_names, resource_units
  FROM workers WHERE id = $1
   FOR NO KEY UPDATE

-- name: sessions
-- Several sessions' rows, for the claims of several sessions in one transaction.
SELECT id, state, session_token_hash, executor_kinds, max_concurrency, stream_epoch,
       placement_labels, resource_names, resource_units
  FROM workers WHERE id = ANY($1::uuid[])
 ORDER BY id
   FOR NO KEY UPDATE

-- name: silent_sessions
-- Sessions silent for longer than the offline threshold: $1 of the session's own
-- heartbeat intervals, and at least $2 ms (workers.OfflineRule), counted from their last
-- heartbeat or from heartbeat_silence_from() (migration 0005: when the platform could
-- record heartbeats again), whichever is later. Busy ones are skipped (a heartbeat holds
-- them): the next pass sees them again.
SELECT id FROM workers
 WHERE state IN ('active', 'draining')
   AND greatest(last_heartbeat_at, (SELECT heartbeat_silence_from())) < clock_timestamp()
       - greatest($1::int * heartbeat_interval_ms, $2::bigint) * interval '1 millisecond'
 ORDER BY id
   FOR NO KEY UPDATE SKIP LOCKED

-- name: runs
SELECT id, state, cancel_requested_at
  FROM runs WHERE id = ANY($1::uuid[])
 ORDER BY id
   FOR NO KEY UPDATE

-- name: free_runs
-- The runs named that no other transaction holds; busy ones are skipped.
SELECT id, state, cancel_requested_at
  FROM runs WHERE id = ANY($1::uuid[])
 ORDER BY id
   FOR NO KEY UPDATE SKIP LOCKED

-- name: expired_runs
-- Retention's batch: up to $2 runs that finished before $1, oldest first, locked to be
-- deleted (FOR UPDATE: the strength the delete takes anyway). Runs another transaction
-- holds (a late result being refused, another pruner) are skipped, never waited for, so
-- this order (not by id) cannot deadlock: no other transaction waits for a finished
-- run's rows while holding something this one needs.
SELECT id FROM runs
 WHERE finished_at < $1
 ORDER BY finished_at, id
 LIMIT $2
   FOR UPDATE SKIP LOCKED

-- name: runs_of_dispatches
-- The runs of the dispatches named: the first step of every settlement. A dispatch's
-- run never changes, so the unlocked subquery is safe.
SELECT id FROM runs
 WHERE id IN (SELECT run_id FROM dispatches WHERE id = ANY($1::bigint[]))
 ORDER BY id
   FOR NO KEY UPDATE

-- name: claimable_runs
-- Runs that own the oldest pending dispatches of the kinds $1 (up to $2 of them).
-- Waiting here, rather than skipping a locked run, keeps concurrent claimers of one
-- busy run from coming back empty. A claim the first round left short runs it again
-- with SKIP LOCKED appended (awp_db.claims): whatever other runs are free now; runs
-- this transaction already locked are returned again.
-- Placement (migration 0020): a placed dispatch counts only if some claimer could ever
-- take it ($3: the claimers' labels, $4: their resources), so that work no claimer can
-- run does not hold back what it can; `placed` says whether the run has a pending
-- dispatch the claim must place (awp_db.placement; an empty partial index otherwise).
SELECT r.id,
       EXISTS (SELECT 1 FROM dispatches p
                WHERE p.run_id = r.id AND p.state = 'pending' AND p.placed) AS placed
  FROM runs r
 WHERE r.id IN (SELECT d.run_id
                  FROM dispatches d
                 WHERE d.state = 'pending' AND d.executor_kind = ANY($1::text[])
                   AND (NOT d.placed
                        OR (d.required_labels <@ $3::text[] AND d.resource_names <@ $4::text[]))
                 ORDER BY d.id + 0  -- see claims.sql take
                 LIMIT $2)
   AND r.state = 'running' AND r.cancel_requested_at IS NULL
 ORDER BY r.id
   FOR NO KEY UPDATE

-- name: dispatches_for_settlement
-- The dispatches named, with their attempt and task (runs already locked), and the
-- live clock read after each row is locked (the subquery carries a locking clause, so
-- PostgreSQL never flattens it and the outer projection runs above the row lock). A
-- result is judged against that clock while its lease can no longer change: renewing,
-- shortening and reaping it all need this row's lock.
SELECT locked.*, clock_timestamp() AS now
  FROM (SELECT d.id, d.run_id, d.task_id, d.state, d.worker_id, d.lease_token_hash,
               d.result_hash, d.lease_expires_at, d.attempt_deadline,
               a.attempt, t.key AS task_key, t.max_attempts, t.hand_backs, t.suspensions,
               t.backoff_initial_ms, t.backoff_max_ms, t.backoff_multiplier
          FROM dispatches d
          JOIN tasks t ON t.id = d.task_id
          LEFT JOIN attempts a ON a.dispatch_id = d.id
         WHERE d.id = ANY($1::bigint[])
         ORDER BY d.id
           FOR NO KEY UPDATE OF d) AS locked

-- name: lease
-- One lease of the worker $2, if still leased: what a heartbeat's renewal and a lost
-- stream's shortening wait for when their first, skipping statement found it busy. Each
-- waits for one such row at a time, holding no other dispatch row (awp_db.locks).
SELECT id FROM dispatches
 WHERE id = $1 AND worker_id = $2 AND state = 'leased'
   FOR NO KEY UPDATE

-- name: expired_dispatches
-- The reaper's dispatches (runs already locked). The expiry is re-checked under the
-- row lock against the live clock, and a row a heartbeat is renewing right now is
-- skipped: the renewal (leases.sql renew, the exact complement of this condition) and
-- the reaper can never both win. A passed deadline wins over an expired lease.
SELECT d.id, d.run_id, d.task_id, d.state, d.worker_id, d.lease_token_hash, d.result_hash,
       d.lease_expires_at, d.attempt_deadline,
       a.attempt, t.key AS task_key, t.max_attempts, t.hand_backs, t.suspensions, t.backoff_initial_ms,
       t.backoff_max_ms, t.backoff_multiplier,
       clock_timestamp() AS now,
       CASE WHEN d.attempt_deadline <= clock_timestamp() THEN 'timed_out'
            ELSE 'interrupted' END AS ending
  FROM dispatches d
  JOIN tasks t ON t.id = d.task_id
  JOIN attempts a ON a.dispatch_id = d.id
 WHERE d.id = ANY($1::bigint[]) AND d.state = 'leased'
   AND (d.lease_expires_at <= clock_timestamp() OR d.attempt_deadline <= clock_timestamp())
 ORDER BY d.id
   FOR NO KEY UPDATE OF d SKIP LOCKED

-- name: schedules
-- Schedule rows, before any run row (locks.py): firing a tick, a trigger, a backfill
-- and every change to a schedule hold its row, so a tick is decided once. The
-- coordinator skips rows a request holds (locks.schedules appends SKIP LOCKED: its
-- next pass finds them); a request waits.
SELECT id, name, workflow_name, workflow_version, input, cron, interval_ms, timezone,
       overlap, catchup, catchup_window_ms, paused, next_tick_at
  FROM schedules WHERE id = ANY($1::uuid[])
 ORDER BY id
   FOR NO KEY UPDATE

-- name: leader_term
-- The first lock of every transaction a leading coordinator runs: the leader row, if
-- ($1 holder, $2 epoch) still hold it. FOR KEY SHARE conflicts with a takeover (which
-- changes the epoch, a key column) but not with a renewal: a takeover waits for this
-- transaction, and once a takeover has committed this finds no row (the lock re-checks
-- the newest version) and the transaction writes nothing. So that a stalled leader
-- cannot hold a takeover off for long, the transaction may then sit idle for at most
-- $3 ms (the lease length) before PostgreSQL ends its session.
SELECT set_config('idle_in_transaction_session_timeout', $3::int::text, true) AS idle_limit
  FROM coordinator_leader
 WHERE holder = $1 AND epoch = $2
   FOR KEY SHARE

-- name: lease_for_memo
-- A step memo's writer (awp_db.checkpoints.record_step): its dispatch locked, holding
-- no other row (as an output stream's append): the reaper, renewals and settlement need
-- this lock too, so the lease cannot end while the memo is judged and stored, and every
-- memo an attempt stored is committed before the attempt ends. With the attempt it is,
-- its task, and the live clock read after the lock.
SELECT locked.*, clock_timestamp() AS now
  FROM (SELECT d.id, d.run_id, d.task_id, d.state, d.worker_id, d.lease_token_hash,
               d.lease_expires_at, d.attempt_deadline, a.fencing_token, a.attempt
          FROM dispatches d
          JOIN attempts a ON a.dispatch_id = d.id
         WHERE d.id = $1
           FOR NO KEY UPDATE OF d) AS locked

-- name: finished_traces
-- Finished traced runs whose span is still to be exported (migration 0018): clears the
-- flag as it returns them (at most once: a span lost in export is not resent). Runs
-- another transaction holds are skipped, never waited for.
UPDATE runs r
   SET trace_pending = false
  FROM (SELECT id FROM runs
         WHERE trace_pending AND finished_at IS NOT NULL
         ORDER BY finished_at
         LIMIT $1
           FOR NO KEY UPDATE SKIP LOCKED) f,
       workflows w
 WHERE r.id = f.id AND w.id = r.workflow_id
RETURNING r.id, r.state, r.created_at, r.finished_at, r.trace_id, r.trace_span,
          r.trace_parent, w.name AS workflow_name, w.version AS workflow_version

-- name: rate_limits
-- Rate limit rows by name, last of the order (locks.py): a Complete's slow-down reports
-- (after its runs and dispatches) and SetRateLimit (after the dispatch lock). Taken in
-- one sorted statement so two Completes pausing the same limits never cross.
SELECT name FROM rate_limits WHERE name = ANY($1::text[]) ORDER BY name FOR NO KEY UPDATE
