-- name: register
-- New capacity: the coordinator is told at commit, so waiting work is dispatched now
-- rather than at its next scan (DESIGN.md §7).
WITH registered AS (
    INSERT INTO workers (name, protocol_version, executor_kinds, max_concurrency, labels, session_token_hash,
                         heartbeat_interval_ms, models, placement_labels, resource_names,
                         resource_units)
    VALUES (:name, :protocol_version, :executor_kinds, :max_concurrency, :labels,
            :session_token_hash, :heartbeat_interval_ms, :models, :placement_labels,
            :resource_names, :resource_units)
    RETURNING id, registered_at
)
SELECT id, registered_at, pg_notify(:channel, 'register') FROM registered

-- name: session
-- Unlocked; locks.sql has the locking reads of sessions.
SELECT id, state, session_token_hash, executor_kinds, max_concurrency, stream_epoch,
       placement_labels, resource_names, resource_units
  FROM workers WHERE id = $1

-- name: sessions
SELECT id, state, session_token_hash, executor_kinds, max_concurrency, stream_epoch,
       placement_labels, resource_names, resource_units
  FROM workers WHERE id = ANY($1::uuid[])

-- name: active_leases
SELECT count(*) FROM dispatches WHERE worker_id = $1 AND state = 'leased'

-- name: active_leases_of
SELECT worker_id, count(*) AS n
  FROM dispatches WHERE worker_id = ANY($1::uuid[]) AND state = 'leased'
 GROUP BY worker_id

-- name: touch
-- The heartbeats of several sessions at once (awp_server.batching.TouchBatcher): the rows
-- are locked in id order (locks.py) before they are written.
WITH live AS (
    SELECT id FROM workers
     WHERE id = ANY($1::uuid[]) AND state IN ('active', 'draining')
     ORDER BY id
       FOR NO KEY UPDATE
)
UPDATE workers w SET last_heartbeat_at = now()
  FROM live
 WHERE w.id = live.id
RETURNING w.id, w.state

-- name: open_stream
UPDATE workers SET stream_epoch = stream_epoch + 1, last_heartbeat_at = now()
 WHERE id = $1 AND state IN ('active', 'draining')
RETURNING stream_epoch

-- name: set_state
UPDATE workers
   SET state = $2,
       stopped_at = CASE WHEN $2 IN ('stopped', 'offline') THEN now() END
 WHERE id = $1
RETURNING state

-- name: mark_offline
UPDATE workers SET state = 'offline', stopped_at = now()
 WHERE id = ANY($1::uuid[]) AND state IN ('active', 'draining')
RETURNING id

-- name: list
SELECT w.id, w.name, w.state, w.executor_kinds, w.max_concurrency, w.labels, w.protocol_version,
       w.registered_at, w.last_heartbeat_at, w.stopped_at,
       (SELECT count(*) FROM dispatches d WHERE d.worker_id = w.id AND d.state = 'leased') AS active_leases,
       w.models, w.resource_names, w.resource_units,
       -- What its live leases reserve of each of its resources (0 for none).
       array(SELECT coalesce((SELECT sum(r.units)
                                FROM dispatches d
                                CROSS JOIN LATERAL unnest(d.resource_names, d.resource_units) AS r (name, units)
                               WHERE d.worker_id = w.id AND d.state = 'leased' AND r.name = c.name), 0)::bigint
               FROM unnest(w.resource_names) WITH ORDINALITY AS c (name, i) ORDER BY c.i) AS resource_reserved
  FROM workers w
 WHERE $1 OR w.state IN ('active', 'draining')
 ORDER BY w.registered_at DESC, w.id
 LIMIT 1000

-- name: record_liveness
-- Server $1 is serving (DESIGN.md §7, migration 0005). A write that finds the previous
-- one stale starts a new stretch: the server or the database was away in between, so no
-- heartbeat could be recorded through it. Rows of servers gone for a day are pruned,
-- skipping any another server is pruning at the same moment: two such deletes of several
-- rows, each in its own plan's order, could otherwise wait for each other (awp_db.locks).
WITH pruned AS (
    DELETE FROM servers
     WHERE id IN (SELECT id FROM servers
                   WHERE id <> $1 AND last_seen_at < now() - interval '1 day'
                     FOR UPDATE SKIP LOCKED)
)
INSERT INTO servers AS s (id, serving_since, last_seen_at, stale_after_ms)
VALUES ($1, now(), now(), $2)
ON CONFLICT (id) DO UPDATE
   SET serving_since = CASE
           WHEN s.last_seen_at + s.stale_after_ms * interval '1 millisecond' < now() THEN now()
           ELSE s.serving_since END,
       last_seen_at = now(),
       stale_after_ms = $2
RETURNING serving_since
