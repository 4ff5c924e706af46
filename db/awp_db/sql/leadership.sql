-- The coordinator leader's lease (migration 0004, docs/leadership.md). Every statement is
-- one autocommitted UPDATE or read on the database clock: nothing depends on the session,
-- so any pooled connection will do, behind a transaction pooler too. The check that a
-- leader transaction still holds its term is a row lock: locks.sql, leader_term.

-- name: acquire
-- Takes the lease if it has expired (or was released), as the next epoch; $1 holder,
-- $2 lease length in ms, $3 its global dispatch limit (published with the term for
-- every grant to keep, a Claim's too: migration 0021). While the lease is live the
-- UPDATE matches nothing and locks nothing. It waits only for transactions of the old leader still holding its term
-- (FOR KEY SHARE), and a concurrent acquire or renewal makes it re-check expiry on the
-- newest row. Also returns the lease as it stood (its holder, and seconds until it
-- expires) so that a standby can sleep until then.
WITH taken AS (
    UPDATE coordinator_leader
       SET holder = $1, epoch = epoch + 1, acquired_at = clock_timestamp(),
           expires_at = clock_timestamp() + $2::int * interval '1 millisecond',
           global_dispatch_limit = $3::int
     WHERE expires_at <= clock_timestamp()
 RETURNING epoch)
SELECT (SELECT epoch FROM taken) AS epoch,
       l.holder,
       extract(epoch FROM l.expires_at - clock_timestamp())::float8 AS expires_in
  FROM coordinator_leader l

-- name: renew
-- Extends the lease by $3 ms from now only while ($1 holder, $2 epoch) still hold it.
-- A lease that expired but was not taken is renewed too: the epoch is unchanged, so no
-- one else led in between. Writes expires_at only, which leader_term's FOR KEY SHARE
-- does not conflict with, so a renewal never waits for the leader's own passes.
UPDATE coordinator_leader
   SET expires_at = clock_timestamp() + $3::int * interval '1 millisecond'
 WHERE holder = $1 AND epoch = $2
RETURNING epoch

-- name: resign
-- A clean stop: the lease ends now, so a standby takes over at its next try.
UPDATE coordinator_leader
   SET expires_at = clock_timestamp()
 WHERE holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()
RETURNING epoch

-- name: current
-- The live lease, if any (for operators and tests).
SELECT holder, epoch, acquired_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS expires_in
  FROM coordinator_leader
 WHERE expires_at > clock_timestamp()
