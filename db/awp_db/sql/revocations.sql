-- Leases ended by anyone but their holder's result, told by the trigger of migration
-- 0012 (NOTIFY awp_lease_revoked). Unlocked: a dispatch that left 'leased' never
-- returns to it, so what this reads cannot be undone by a later commit.

-- name: revoked
-- Of the notified (worker, dispatch) pairs, those the database confirms: that worker
-- held that dispatch, and the dispatch is no longer leased.
SELECT d.worker_id, d.id AS dispatch_id
  FROM unnest($1::uuid[], $2::bigint[]) AS n (worker_id, dispatch_id)
  JOIN dispatches d ON d.id = n.dispatch_id AND d.worker_id = n.worker_id
 WHERE d.state IN ('canceled', 'expired')
