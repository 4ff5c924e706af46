-- Leases once issued: renewing them, fencing results, handing them back (DESIGN.md §4).
-- The locking reads of settlement are in locks.sql.

-- name: lease_digests
-- Unlocked read: a dispatch's token digest and holder never change once leased.
SELECT id, run_id, worker_id, state, lease_token_hash
  FROM dispatches WHERE id = ANY($1::bigint[])

-- name: live_lease
-- The lease $1 as awp_kernel.fencing judges it (holder, token digest, state, times and
-- the database clock), with what its holder may use it for. Unlocked read.
SELECT d.run_id, d.worker_id, d.state, d.lease_token_hash, d.lease_expires_at,
       d.attempt_deadline, clock_timestamp() AS now, d.fencing_token,
       t.key AS task_key, t.depends_on, a.attempt
  FROM dispatches d
  JOIN tasks t ON t.id = d.task_id
  LEFT JOIN attempts a ON a.dispatch_id = d.id
 WHERE d.id = $1

-- name: renew
-- The lease rule (awp_kernel.fencing: holder, state, expiry and deadline), restated where
-- the row is locked: validity is re-checked under the row lock against the live clock, so a renewal and
-- a reaper settling the same lease can never both win. The leases are locked first, in
-- id order, skipping busy ones (awp_db.locks: a renewal holds no run lock, so it must
-- never wait for one lease while holding another); an UPDATE alone locks them in
-- whatever order its plan visits them. Returns every lease it locked, with its new
-- expiry if renewed (NULL: no longer valid); the busy ones are not returned.
WITH held AS (
    SELECT id FROM dispatches
     WHERE id = ANY($2::bigint[]) AND worker_id = $1 AND state = 'leased'
     ORDER BY id
       FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE dispatches d
       SET lease_expires_at = least(clock_timestamp() + $3 * interval '1 millisecond', d.attempt_deadline)
      FROM held
     WHERE d.id = held.id
       AND d.lease_expires_at > clock_timestamp() AND d.attempt_deadline > clock_timestamp()
    RETURNING d.id, d.lease_expires_at,
              extract(epoch FROM d.lease_expires_at - clock_timestamp()) * 1000 AS lease_remaining_ms,
              extract(epoch FROM d.attempt_deadline - clock_timestamp()) * 1000 AS attempt_remaining_ms
)
SELECT h.id, r.lease_expires_at, r.lease_remaining_ms, r.attempt_remaining_ms
  FROM held h LEFT JOIN renewed r ON r.id = h.id

-- name: shorten
-- The worker's heartbeat stream broke: its leases ($2: all of them, or those listed) now
-- expire after the stream grace ($3 ms). Locked in id order first, skipping busy ones, as
-- renew; returns every lease it locked.
WITH held AS (
    SELECT id FROM dispatches
     WHERE worker_id = $1 AND state = 'leased' AND ($2::bigint[] IS NULL OR id = ANY($2))
     ORDER BY id
       FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE dispatches d
   SET lease_expires_at = least(d.lease_expires_at, clock_timestamp() + $3 * interval '1 millisecond')
  FROM held
 WHERE d.id = held.id
RETURNING d.id

-- name: worker_leases
SELECT id, run_id FROM dispatches WHERE worker_id = ANY($1::uuid[]) AND state = 'leased'
