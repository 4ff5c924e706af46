-- Rate limits and token budgets (awp_db.ratelimits; the grant reads them in grant.sql).

-- name: set
-- The caller holds the dispatch lock: a grant sees one budget from its count to its charge.
INSERT INTO rate_limits AS l (name, units, period_ms, updated_by)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE
   SET units = excluded.units, period_ms = excluded.period_ms,
       updated_at = clock_timestamp(), updated_by = excluded.updated_by
RETURNING l.name

-- name: read
-- Limits $1 (NULL: all), each with the units charged in the window ending now.
SELECT l.name, l.units, l.period_ms, l.paused_until, l.updated_at, l.updated_by,
       coalesce((SELECT sum(coalesce(c.actual, c.estimate)) FROM rate_charges c
                  WHERE c.limit_name = l.name
                    AND c.granted_at > clock_timestamp() - l.period_ms * interval '1 millisecond'),
                0)::bigint AS used,
       l.paused_until > clock_timestamp() AS paused
  FROM rate_limits l
 WHERE $1::text IS NULL OR l.name = $1
 ORDER BY l.name

-- name: report_usage
-- Accepted results' usage replaces their grants' estimates (once: the result is accepted
-- once). A limit the task did not declare, or that was not set at its grant, has no row.
UPDATE rate_charges c
   SET actual = u.units, reported_at = clock_timestamp()
  FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS u (dispatch_id, limit_name, units)
 WHERE c.dispatch_id = u.dispatch_id AND c.limit_name = u.limit_name AND c.actual IS NULL

-- name: slow_down
-- A provider's "slow down": the limit grants nothing until the latest retry-after asked.
UPDATE rate_limits l
   SET paused_until = greatest(coalesce(l.paused_until, '-infinity'),
                               clock_timestamp() + s.ms * interval '1 millisecond')
  FROM (SELECT name, max(ms) AS ms
          FROM unnest($1::text[], $2::bigint[]) AS x (name, ms) GROUP BY name) s
 WHERE l.name = s.name
RETURNING l.name, l.paused_until
