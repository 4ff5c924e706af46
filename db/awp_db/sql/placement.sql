-- Placement at claim (awp_db.placement, docs/design.md §17). The callers hold the
-- claiming workers' session rows and the runs (awp_db.locks order).

-- name: placeable
-- The pending placed dispatches of the locked runs $1 (kinds $2) that each claiming
-- worker $3 may take now, oldest first: it runs the kind, has the required labels and
-- enough capacity of each resource (placement_fits), and the dispatch prefers it or no
-- longer prefers anyone (prefer_until passed or NULL). Whether its resources are free
-- now is the caller's count. At most $4 rows.
SELECT d.id, w.id AS worker_id, d.resource_names, d.resource_units
  FROM dispatches d
  JOIN workers w ON w.id = ANY($3::uuid[]) AND d.executor_kind = ANY(w.executor_kinds)
 WHERE d.state = 'pending' AND d.placed
   AND d.run_id = ANY($1::uuid[]) AND d.executor_kind = ANY($2::text[])
   AND placement_fits(d.required_labels, d.resource_names, d.resource_units,
                      w.placement_labels, w.resource_names, w.resource_units)
   AND (d.prefer_until IS NULL OR d.prefer_until <= clock_timestamp()
        OR placement_prefers(d.sticky_worker, d.preferred_labels, w.id, w.placement_labels))
 ORDER BY d.id, w.id
 LIMIT $4

-- name: reserved
-- The units of each resource the live leases of workers $1 reserve: exact while their
-- session rows are locked, since only a claim, under that lock, adds a lease to one.
SELECT d.worker_id, r.name, sum(r.units)::bigint AS units
  FROM dispatches d
 CROSS JOIN LATERAL unnest(d.resource_names, d.resource_units) AS r (name, units)
 WHERE d.worker_id = ANY($1::uuid[]) AND d.state = 'leased' AND cardinality(d.resource_names) > 0
 GROUP BY d.worker_id, r.name
