-- Operator figures for GetStats. Both queries run in one read-only snapshot.

-- name: counts
-- (section, state, executor_kind, n); executor_kind is NULL where counts are not per kind.
SELECT 'tasks' AS section, t.state, t.executor_kind, count(*) AS n
  FROM tasks t JOIN runs r ON r.id = t.run_id
 WHERE r.state = 'running'
 GROUP BY t.state, t.executor_kind
UNION ALL
SELECT 'dispatches', state, executor_kind, count(*)
  FROM dispatches
 WHERE state IN ('pending', 'leased')
 GROUP BY state, executor_kind
UNION ALL
SELECT 'runs', state, NULL, count(*) FROM runs GROUP BY state
UNION ALL
SELECT 'workers', state, NULL, count(*) FROM workers GROUP BY state
ORDER BY 1, 2, 3

-- name: oldest_pending
-- NULL when nothing is pending. The live clock: now() would be the snapshot's start.
SELECT (extract(epoch FROM clock_timestamp() - min(created_at)) * 1000)::float8 AS age_ms
  FROM dispatches
 WHERE state = 'pending'

-- name: gauges
-- The coordinator's Prometheus gauges, every query on a partial index: (section, state,
-- label, n). label: the executor kind (dispatches, ready_tasks, and the kinds live
-- workers serve: counted 0 rather than missing) or the workflow name (finished_runs,
-- within the last $1 seconds by the live clock).
SELECT 'dispatches' AS section, state, executor_kind AS label, count(*) AS n
  FROM dispatches
 WHERE state IN ('pending', 'leased')
 GROUP BY state, executor_kind
UNION ALL
SELECT 'ready_tasks', 'ready', executor_kind, count(*)
  FROM tasks
 WHERE state = 'ready'
 GROUP BY executor_kind
UNION ALL
-- Label: the base priority the grant orders by (the run's plus the task's, awp_db.grant).
SELECT 'ready_by_priority', 'ready', (r.priority + t.priority)::text, count(*)
  FROM tasks t JOIN runs r ON r.id = t.run_id
 WHERE t.state = 'ready'
 GROUP BY r.priority + t.priority
UNION ALL
SELECT 'workers', state, NULL, count(*)
  FROM workers
 WHERE state IN ('active', 'draining')
 GROUP BY state
UNION ALL
SELECT DISTINCT 'served_kinds', 'served', unnest(executor_kinds), 0
  FROM workers
 WHERE state IN ('active', 'draining')
UNION ALL
SELECT 'running_runs', 'running', NULL, count(*)
  FROM runs
 WHERE state = 'running'
UNION ALL
SELECT 'finished_runs', r.state, w.name, count(*)
  FROM runs r JOIN workflows w ON w.id = r.workflow_id
 WHERE r.finished_at > clock_timestamp() - make_interval(secs => $1::float8)
 GROUP BY r.state, w.name

-- name: units_held
-- Concurrency units held now (live dispatches holding a key, dispatches_live_keyed) and
-- the distinct keys they hold.
SELECT count(*)::bigint AS units, count(DISTINCT k.key)::bigint AS keys
  FROM dispatches d CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key)
 WHERE d.state IN ('pending', 'leased') AND cardinality(d.concurrency_keys) > 0

-- name: resources
-- Each live worker's capacity of each resource and the units its leases reserve now
-- (placement, migration 0020).
SELECT w.id AS worker_id, w.name AS worker_name, c.name AS resource, c.units AS capacity,
       coalesce((SELECT sum(r.units)
                   FROM dispatches d
                  CROSS JOIN LATERAL unnest(d.resource_names, d.resource_units) AS r (name, units)
                  WHERE d.worker_id = w.id AND d.state = 'leased' AND r.name = c.name), 0)::bigint
           AS reserved
  FROM workers w CROSS JOIN LATERAL unnest(w.resource_names, w.resource_units) AS c (name, units)
 WHERE w.state IN ('active', 'draining')
 ORDER BY w.id, c.name

-- name: keys_waiting
-- Ready tasks of running runs held back by each concurrency key now: its live holders
-- reached its max (the grant's own test, grant.sql: candidates).
WITH held AS (
    SELECT k.key, count(*)::int AS n
      FROM dispatches d CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key)
     WHERE d.state IN ('pending', 'leased') AND cardinality(d.concurrency_keys) > 0
     GROUP BY k.key
)
SELECT k.key AS name, count(*)::bigint AS waiting
  FROM tasks t JOIN runs r ON r.id = t.run_id
 CROSS JOIN LATERAL unnest(t.concurrency_keys, t.concurrency_max) AS k (key, max)
  JOIN held h ON h.key = k.key
 WHERE t.state = 'ready' AND r.state = 'running' AND cardinality(t.concurrency_keys) > 0
   AND h.n >= k.max
 GROUP BY k.key
 ORDER BY k.key

-- name: rate_uses_ready
-- Ready tasks of running runs by each rate limit they use and the units they need:
-- awp_db.stats compares them with each limit's free units (ratelimits.list_all).
SELECT u.name, u.units, count(*)::bigint AS tasks
  FROM tasks t JOIN runs r ON r.id = t.run_id
 CROSS JOIN LATERAL unnest(t.rate_names, t.rate_units) AS u (name, units)
 WHERE t.state = 'ready' AND r.state = 'running' AND cardinality(t.rate_names) > 0
 GROUP BY u.name, u.units
