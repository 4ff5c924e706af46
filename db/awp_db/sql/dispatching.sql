-- Creating dispatches: what may run now, within every limit, fairly across runs.

-- name: serialise
-- Dispatch creation is the only thing that raises the number of queued + running tasks
-- and live dispatches; serialising it makes every limit exact, even with two
-- coordinators at once (leadership is for efficiency only). $1: the key
-- (awp_db.signals).
SELECT pg_advisory_xact_lock($1::bigint)

-- name: capacity
-- Per executor kind: free slots and all slots of the active workers (a worker counts
-- for each of its kinds) and the pending dispatches; and, on every row, the leased
-- dispatches of all kinds. Each count reads a partial index (pending by kind, leased
-- by worker): a scan of every live dispatch would also visit the dead entries that
-- finished ones leave in the indexes until vacuum.
WITH leased AS (
    SELECT worker_id, count(*) AS n
      FROM dispatches WHERE state = 'leased'
     GROUP BY worker_id
), slots AS (
    SELECT k.kind,
           sum(greatest(w.max_concurrency - coalesce(l.n, 0), 0))::bigint AS free,
           sum(w.max_concurrency)::bigint AS slots
      FROM workers w
      CROSS JOIN LATERAL unnest(w.executor_kinds) AS k (kind)
      LEFT JOIN leased l ON l.worker_id = w.id
     WHERE w.state = 'active'
     GROUP BY k.kind
), pending AS (
    -- `open`: offers without placement requirements. Those with some are left out of the
    -- kind's refill (only the workers that fit them may take them, and the grant bounds
    -- them by those workers' room, grant.sql: fit_room), so they never hold back the
    -- kind's other work; `n` counts every one (the global limit's in-flight count).
    SELECT executor_kind AS kind, count(*) AS n,
           count(*) FILTER (WHERE cardinality(required_labels) = 0
                              AND cardinality(resource_names) = 0) AS open
      FROM dispatches WHERE state = 'pending'
     GROUP BY executor_kind
)
SELECT coalesce(s.kind, p.kind) AS kind,
       coalesce(s.free, 0)::bigint AS free,
       coalesce(s.slots, 0)::bigint AS slots,
       coalesce(p.n, 0)::bigint AS pending,
       coalesce(p.open, 0)::bigint AS open_pending,
       (SELECT coalesce(sum(n), 0) FROM leased)::bigint AS leased
  FROM slots s FULL JOIN pending p ON p.kind = s.kind

-- name: create
-- Runs are locked by the caller (locks.sql). Only tasks still ready move; each gets one dispatch
-- (the unique index refuses a second live one), which holds the task's concurrency keys
-- from now until it ends (grant.sql), and carries its placement (migration 0020).
WITH moved AS (
    UPDATE tasks t SET state = 'queued'
     WHERE t.id = ANY($1::bigint[]) AND t.state = 'ready'
       -- A limit paused after the grant read it stops its tasks here: the pause of a
       -- slow-down report commits with the Complete that holds the reporting task's run,
       -- and a pass that read the candidates before that commit waited for the run's
       -- lock to get here (a statement of its own, so it sees the pause now).
       AND NOT EXISTS (SELECT 1 FROM rate_limits l
                        WHERE l.name = ANY(t.rate_names) AND l.paused_until > clock_timestamp())
 RETURNING t.id, t.run_id, t.key, t.executor_kind, t.concurrency_keys, t.concurrency_max,
           t.rate_names, t.rate_units, t.required_labels, t.preferred_labels,
           t.resource_names, t.resource_units, t.sticky
), stuck AS (
    -- A sticky task prefers the worker of the run's most recent earlier attempt (of
    -- another task: a retry is no reason to go back to where it failed).
    SELECT m.*, CASE WHEN m.sticky THEN
               (SELECT a.worker_id FROM attempts a
                 WHERE a.run_id = m.run_id AND a.task_id <> m.id
                 ORDER BY a.started_at DESC, a.id DESC LIMIT 1) END AS sticky_worker
      FROM moved m
), placed AS (
    -- Preferring (sticky or preferred labels) lasts $3 ms (grant.PLACEMENT_FALLBACK_MS),
    -- and only if a worker it prefers is active now and meets its requirements; else
    -- anyone may take it at once.
    SELECT s.*, CASE WHEN (s.sticky_worker IS NOT NULL OR cardinality(s.preferred_labels) > 0)
                      AND EXISTS (SELECT 1 FROM workers w
                                   WHERE w.state = 'active'
                                     AND s.executor_kind = ANY(w.executor_kinds)
                                     AND placement_fits(s.required_labels, s.resource_names,
                                                        s.resource_units, w.placement_labels,
                                                        w.resource_names, w.resource_units)
                                     AND placement_prefers(s.sticky_worker, s.preferred_labels,
                                                           w.id, w.placement_labels))
                     THEN clock_timestamp() + $3::bigint * interval '1 millisecond' END AS prefer_until
      FROM stuck s
), created AS (
    -- In the order the grant chose them ($1): a Claim leases the oldest dispatch first,
    -- so the grant's round-robin order is the order work starts in.
    -- $2: the effective priority each was ranked at, aligned with $1.
    INSERT INTO dispatches (run_id, task_id, executor_kind, concurrency_keys, concurrency_max,
                            priority, required_labels, preferred_labels, resource_names,
                            resource_units, sticky_worker, prefer_until)
    SELECT m.run_id, m.id, m.executor_kind, m.concurrency_keys, m.concurrency_max, g.priority,
           m.required_labels, m.preferred_labels, m.resource_names, m.resource_units,
           m.sticky_worker, m.prefer_until
      FROM placed m
      JOIN unnest($1::bigint[], $2::int[]) WITH ORDINALITY AS g (id, priority, n) ON g.id = m.id
     ORDER BY g.n
 RETURNING id, task_id, placed
), charged AS (
    -- Each rate limit the task uses, if set, is charged the estimate now, with the budget
    -- in force (SetRateLimit takes the dispatch lock too, so it is the one the grant saw).
    INSERT INTO rate_charges (dispatch_id, limit_name, granted_at, estimate, budget_units,
                              period_ms)
    SELECT c.id, k.name, clock_timestamp(), k.units, l.units, l.period_ms
      FROM created c JOIN moved m ON m.id = c.task_id
      CROSS JOIN LATERAL unnest(m.rate_names, m.rate_units) AS k (name, units)
      JOIN rate_limits l ON l.name = k.name
), touched AS (
    -- The round-robin across runs (grant.sql) goes by last_dispatched_at: the runs of one
    -- statement are stamped in the order they were granted ($1, a run at its last
    -- grant), so the next grant serves them in that order again after every run served
    -- longer ago. (One clock_timestamp() per row stamped them in the order the rows
    -- were updated: the same runs always looked older than the rest of their batch and
    -- went first each time, and two keys of ten got twice the others' starts.)
    -- statement_timestamp(): one value for them all (the statement runs under the
    -- dispatch lock, so a later grant's is later).
    UPDATE runs r SET last_dispatched_at = statement_timestamp() + g.last * interval '1 microsecond'
      FROM (SELECT m.run_id, max(g.n) AS last
              FROM moved m JOIN unnest($1::bigint[]) WITH ORDINALITY AS g (id, n) ON g.id = m.id
             GROUP BY m.run_id) g
     WHERE r.id = g.run_id
)
SELECT m.run_id, m.key, m.executor_kind, c.id AS dispatch_id, c.placed
  FROM moved m JOIN created c ON c.task_id = m.id

-- name: unservable
-- Pending dispatches no active worker could ever claim: none runs its executor kind with
-- its required labels and its resources' units (placement_fits, migration 0020).
SELECT d.id, d.run_id
  FROM dispatches d
 WHERE d.state = 'pending'
   AND NOT EXISTS (SELECT 1 FROM workers w
                    WHERE w.state = 'active' AND d.executor_kind = ANY(w.executor_kinds)
                      AND (NOT d.placed
                           OR placement_fits(d.required_labels, d.resource_names, d.resource_units,
                                             w.placement_labels, w.resource_names, w.resource_units)))
 ORDER BY d.id + 0  -- from the pending partial index, not a primary key walk
 LIMIT $1

-- name: withdraw
-- Runs locked by the caller. The offer lapses; the task is ready again, nothing spent.
WITH lapsed AS (
    UPDATE dispatches SET state = 'expired', finished_at = clock_timestamp()
     WHERE id = ANY($1::bigint[]) AND state = 'pending'
 RETURNING task_id
)
UPDATE tasks t SET state = 'ready'
  FROM lapsed WHERE t.id = lapsed.task_id AND t.state = 'queued'
RETURNING t.run_id, t.key

-- name: try_serialise
-- A Claim's grant (awp_db.dispatching.grant_for_claims): the dispatch lock if free now,
-- never waited for (the Claim already holds rows that come after it in the lock order),
-- and only when a task of the kinds $2 is ready at all (CASE: the probe first, so a Claim
-- that finds nothing to do costs one probe of the ready tasks' index and takes no lock);
-- with the leading coordinator's global dispatch limit (0: unbounded), published with
-- its term (migration 0021) so that a Claim's grant keeps it too.
SELECT CASE WHEN EXISTS (SELECT 1 FROM tasks
                          WHERE state = 'ready' AND executor_kind = ANY($2::text[]))
            THEN pg_try_advisory_xact_lock($1::bigint) ELSE false END AS locked,
       (SELECT global_dispatch_limit FROM coordinator_leader) AS global_limit

-- name: serialise_if_bare
-- A Claim's first statement (awp_db.dispatching.serialise_for_claims): the dispatch lock,
-- waited for, when some task is ready and no offer is left at all -- the moment the
-- Claim will grant -- so that it queues behind a pass granting the same tasks rather
-- than losing the race to it and coming back empty. No row: it did not lock. Taken
-- before any row, as the lock order requires of a wait for this lock.
SELECT pg_advisory_xact_lock($1::bigint)
 WHERE EXISTS (SELECT 1 FROM tasks WHERE state = 'ready')
   AND NOT EXISTS (SELECT 1 FROM dispatches WHERE state = 'pending')
