-- The grant rule (awp_db.grant): which ready tasks may be granted a lease now. The
-- caller holds the dispatch lock (dispatching.sql: serialise), so the units counted here
-- are exact: nothing else creates a live dispatch until this transaction ends, and every
-- dispatch that ends meanwhile only frees units.

-- name: candidates
-- Ready tasks of runs not being canceled, round-robin across runs: every run's first
-- task, then every run's second... Runs never dispatched come first, then the least
-- recently dispatched. Each run stays within its own concurrency (queued + running; a
-- running map task is not counted, its elements are).
-- Keyed limits: a unit of a key is held by each live (pending or leased) dispatch that
-- holds it; a plain count under the dispatch lock, never SKIP LOCKED (which would skip a
-- row that holds budget). A task is a candidate only while each of its keys has a unit
-- free, and for its first key only as many as are free, taken round-robin across keys
-- (krn) so that one busy key cannot fill the batch. `held` returns each key's units held
-- when the pass began; the caller counts the units it grants on top (a task of several
-- keys is checked for all of them there).
-- Placement: a task is a candidate only while an active worker of its kind has its
-- required labels and each of its resources' units (placement_fits, migration 0020);
-- `fit_room` is how many more offers of its requirements those workers could take now,
-- the caller's bound for such tasks (the kind's budget leaves their offers out, so that
-- offers only some workers may take do not hold back the others' work).
-- Rate limits: a task is a candidate only while each rate limit it uses, if set, is not
-- paused and has its units free in the window ending now (charges granted in the last
-- period, each its reported usage where known, else its estimate). `rate_free` returns
-- each one's free units (NULL: no such limit, unbounded); the caller counts its own.
-- Priorities (docs/design.md §17): a task's base priority is its run's plus its own,
-- clamped to the range ($4..$5); it rises one level per $3 ms it has waited since ready_at, up to
-- `top`, the highest base among the candidates. Candidates go by that effective priority
-- first, then the round-robin order above; a task lifted to `top` from below (overdue)
-- goes before the tasks whose base is `top`, so a continuous stream of those cannot keep
-- it waiting past (top - base) steps. With equal priorities nothing is lifted or overdue
-- and the order is the round-robin one. A run's own tasks are taken (rn) by their task
-- priority, then in order.
-- Each run's ready tasks are read by task priority, then in order, from the
-- tasks_ready_ranked index (migration 0019), so the LIMIT keeps a run's highest ones and
-- the walk stops there. (Written as "run_id = ... ORDER BY priority DESC, id", which only
-- that index serves: a range on run_id instead is planned as a bitmap scan and a sort of
-- every ready task of the run, ~20 ms a pass with 10 runs of 1,000 ready tasks instead
-- of ~5 with EXPLAIN ANALYZE.)
WITH held AS (
    SELECT k.key, count(*)::int AS n
      FROM dispatches d CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key)
     WHERE d.state IN ('pending', 'leased') AND cardinality(d.concurrency_keys) > 0
     GROUP BY k.key
), rates AS (
    SELECT l.name,
           CASE WHEN l.paused_until > clock_timestamp() THEN 0
                ELSE l.units - coalesce(
                    (SELECT sum(coalesce(c.actual, c.estimate)) FROM rate_charges c
                      WHERE c.limit_name = l.name
                        AND c.granted_at > clock_timestamp() - l.period_ms * interval '1 millisecond'),
                    0)
           END AS free
      FROM rate_limits l
), plain AS (
    -- The plain path (migration 0023): no ready task has a priority, a concurrency key, a
    -- rate limit or a placement requirement, and no running run a priority. Then every
    -- candidate has the same effective priority (none is lifted or overdue) and its turn
    -- is its place in its run (rn), so the order is rn, then the runs' round-robin: the
    -- first $2 candidates all come from the first $2 runs in turn that have one, and
    -- only those are read. (With 1,000 runs of one ready task each, reading every run
    -- cost 10-12 ms a pass on an idle machine, 40 ms under load, and the Claims queued
    -- behind it for the dispatch lock.) Each probe reads an index that holds only the
    -- rows that rule it out.
    SELECT NOT EXISTS (SELECT 1 FROM tasks
                        WHERE state = 'ready'
                          AND (priority <> 0 OR cardinality(concurrency_keys) > 0
                               OR cardinality(rate_names) > 0 OR cardinality(required_labels) > 0
                               OR cardinality(resource_names) > 0))
       AND NOT EXISTS (SELECT 1 FROM runs WHERE state = 'running' AND priority <> 0) AS yes
), in_turn AS (
    -- The plain path's runs: the first $2 in the round-robin's order with a candidate (a
    -- ready task of the kinds $1, and room in the run's concurrency), walked in the
    -- order of the runs_running index.
    SELECT r.id FROM runs r
     WHERE r.state = 'running' AND r.cancel_requested_at IS NULL
       AND EXISTS (SELECT 1 FROM tasks t
                    WHERE t.run_id = r.id AND t.state = 'ready' AND t.executor_kind = ANY($1::text[]))
       AND (r.concurrency = 0
            OR r.concurrency > (SELECT count(*) FROM tasks q
                                 WHERE q.run_id = r.id AND q.state IN ('queued', 'running')
                                   AND q.map_over IS NULL))
     ORDER BY r.last_dispatched_at NULLS FIRST, r.created_at, r.id
     LIMIT $2
), live_ids AS (
    -- One branch runs (each condition on `plain` is decided once, before either).
    SELECT id FROM in_turn WHERE (SELECT yes FROM plain)
    UNION ALL
    SELECT r.id FROM runs r
     WHERE NOT (SELECT yes FROM plain)
       AND r.state = 'running' AND r.cancel_requested_at IS NULL
       AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'ready')
), live AS MATERIALIZED (
    -- MATERIALIZED: each run's in-flight count once per pass. Inlined, it was counted
    -- again for every candidate row of the run (EXPLAIN ANALYZE, 10 runs of 1,000 ready
    -- tasks, 64 asked: 640 counts instead of 10; 7.1 ms a pass instead of 5.1).
    -- A run without a concurrency limit is not counted (`picked` reads in_flight only
    -- under a limit): the count walks every live task of the run, its ready ones too
    -- (EXPLAIN ANALYZE, 10 runs of 1,000 tasks: 120 rows a run, 2.2 of a pass's 9 ms).
    SELECT r.id, r.concurrency, r.last_dispatched_at, r.created_at, r.priority,
           CASE WHEN r.concurrency = 0 THEN 0
                ELSE (SELECT count(*) FROM tasks q
                       WHERE q.run_id = r.id AND q.state IN ('queued', 'running')
                         AND q.map_over IS NULL) END AS in_flight
      FROM runs r
     WHERE r.id IN (SELECT id FROM live_ids)
), offered AS (
    SELECT c.*, l.last_dispatched_at, l.created_at, l.id AS live_id, l.concurrency,
           l.in_flight
      FROM live l
      CROSS JOIN LATERAL (
          SELECT t.id, t.run_id, t.executor_kind, t.concurrency_keys, t.concurrency_max,
                 u.held, t.rate_names, t.rate_units, v.rate_free, t.required_labels,
                 t.resource_names, t.resource_units, f.fit_room,
                 greatest($4::int, least($5::int, l.priority + t.priority)) AS base,
                 coalesce(floor(extract(epoch FROM clock_timestamp() - t.ready_at) * 1000
                                / $3::bigint)::int, 0) AS aged,
                 t.priority AS task_priority
            FROM tasks t
            CROSS JOIN LATERAL (
                SELECT coalesce(array_agg(coalesce(h.n, 0) ORDER BY k.i), '{}') AS held,
                       coalesce(bool_and(coalesce(h.n, 0) < k.max), true) AS open
                  FROM unnest(t.concurrency_keys, t.concurrency_max) WITH ORDINALITY AS k (key, max, i)
                  LEFT JOIN held h ON h.key = k.key) u
            CROSS JOIN LATERAL (
                SELECT coalesce(array_agg(r.free ORDER BY k.i), '{}') AS rate_free,
                       coalesce(bool_and(r.free IS NULL OR k.units <= r.free), true) AS open
                  FROM unnest(t.rate_names, t.rate_units) WITH ORDINALITY AS k (name, units, i)
                  LEFT JOIN rates r ON r.name = k.name) v
            -- Placement's own budget (NULL: none): the leases the active workers that fit
            -- the task could take now (free slots, and free units of each resource it
            -- reserves), less the pending offers of the same requirements.
            CROSS JOIN LATERAL (
                SELECT CASE WHEN cardinality(t.required_labels) = 0
                                 AND cardinality(t.resource_names) = 0 THEN NULL
                       ELSE (SELECT coalesce(sum(greatest(0, least(
                                        w.max_concurrency
                                        - (SELECT count(*) FROM dispatches l
                                            WHERE l.worker_id = w.id AND l.state = 'leased'),
                                        (SELECT min((c.units - coalesce((
                                                    SELECT sum(r.units) FROM dispatches l
                                                     CROSS JOIN LATERAL unnest(l.resource_names, l.resource_units)
                                                           AS r (name, units)
                                                     WHERE l.worker_id = w.id AND l.state = 'leased'
                                                       AND r.name = n.name), 0)) / n.units)
                                           FROM unnest(t.resource_names, t.resource_units) AS n (name, units)
                                           JOIN unnest(w.resource_names, w.resource_units) AS c (name, units)
                                             ON c.name = n.name)))), 0)
                               FROM workers w
                              WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                                AND placement_fits(t.required_labels, t.resource_names,
                                                   t.resource_units, w.placement_labels,
                                                   w.resource_names, w.resource_units))
                            - (SELECT count(*) FROM dispatches p
                                WHERE p.state = 'pending' AND p.executor_kind = t.executor_kind
                                  AND p.required_labels = t.required_labels
                                  AND p.resource_names = t.resource_names
                                  AND p.resource_units = t.resource_units) END AS fit_room) f
           WHERE t.run_id = l.id AND t.state = 'ready'
             AND t.executor_kind = ANY($1::text[]) AND u.open AND v.open
             -- Placement: only what an active worker could ever run (its kind, required
             -- labels and resources' capacities); the claim checks the rest.
             AND CASE WHEN cardinality(t.required_labels) = 0 AND cardinality(t.resource_names) = 0
                      THEN true
                      ELSE EXISTS (SELECT 1 FROM workers w
                                    WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                                      AND placement_fits(t.required_labels, t.resource_names,
                                                         t.resource_units, w.placement_labels,
                                                         w.resource_names, w.resource_units)) END
           ORDER BY t.priority DESC, t.id
           LIMIT $2) c
), picked AS (
    -- Numbered after the LIMIT, so that each run's lookup stays a walk of the index.
    SELECT n.* FROM (
        SELECT o.*, row_number() OVER (PARTITION BY o.live_id ORDER BY o.task_priority DESC, o.id) AS rn
          FROM offered o) n
     WHERE n.concurrency = 0 OR n.rn <= n.concurrency - n.in_flight
), ranked AS (
    SELECT e.*,
           CASE WHEN cardinality(e.concurrency_keys) = 0 THEN e.rn
                ELSE row_number() OVER (
                    PARTITION BY e.concurrency_keys[1]
                    ORDER BY e.priority DESC, e.overdue DESC, e.rn,
                             e.last_dispatched_at NULLS FIRST, e.created_at, e.live_id, e.id)
           END AS turn
      FROM (SELECT p.*, least(p.base + p.aged, p.top) AS priority,
                   p.base < p.top AND p.base + p.aged >= p.top AS overdue
              FROM (SELECT q.*, max(q.base) OVER () AS top FROM picked q) p) e
), fitted AS (
    -- Each placement requirement's candidates in order (only those with one: numbering
    -- every candidate would sort them all once more), kept within its fit_room.
    SELECT f.id, row_number() OVER (
               PARTITION BY f.executor_kind, f.required_labels, f.resource_names, f.resource_units
               ORDER BY f.priority DESC, f.overdue DESC, f.rn, f.last_dispatched_at NULLS FIRST,
                        f.created_at, f.live_id, f.id) AS fit_turn
      FROM ranked f WHERE f.fit_room IS NOT NULL
)
SELECT id, run_id, executor_kind, concurrency_keys, concurrency_max, held, rate_names,
       rate_units, rate_free, priority, required_labels, resource_names, resource_units, fit_room
  FROM ranked r
 WHERE (cardinality(concurrency_keys) = 0 OR turn <= concurrency_max[1] - held[1])
   AND (fit_room IS NULL OR (SELECT x.fit_turn FROM fitted x WHERE x.id = r.id) <= fit_room)
 ORDER BY priority DESC, overdue DESC, turn, rn, last_dispatched_at NULLS FIRST, created_at,
          live_id, id
 LIMIT $2

-- name: explain
-- Why each ready task of run $1 is not granted now, by the same counts as `candidates`
-- ($2: the aging step in ms, $3/$4: the priority range)
-- (the first reason found; a task with none is only waiting for the next pass or a free
-- slot), and why each queued task's placed offer is not leased yet (its resources
-- reserved on every worker that could run it, or a preferred worker's turn).
-- Unlocked: a reading, not a decision.
WITH reserved AS (
    SELECT d.worker_id, r.name, sum(r.units) AS n
      FROM dispatches d CROSS JOIN LATERAL unnest(d.resource_names, d.resource_units) AS r (name, units)
     WHERE d.state = 'leased' AND cardinality(d.resource_names) > 0
     GROUP BY d.worker_id, r.name
), held AS (
    SELECT k.key, count(*)::int AS n
      FROM dispatches d CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key)
     WHERE d.state IN ('pending', 'leased') AND cardinality(d.concurrency_keys) > 0
     GROUP BY k.key
), rates AS (
    SELECT l.name, l.units, l.period_ms, l.paused_until,
           l.paused_until > clock_timestamp() AS paused,
           coalesce((SELECT sum(coalesce(c.actual, c.estimate)) FROM rate_charges c
                      WHERE c.limit_name = l.name
                        AND c.granted_at > clock_timestamp() - l.period_ms * interval '1 millisecond'),
                    0) AS used
      FROM rate_limits l
), ahead AS (
    -- The highest base priority among the ready tasks of running runs, by executor kind
    -- (the top `candidates` ages towards; $2-$4 as its $3-$5).
    SELECT t.executor_kind, max(greatest($3::int, least($4::int, r.priority + t.priority))) AS top
      FROM tasks t JOIN runs r ON r.id = t.run_id
     WHERE t.state = 'ready' AND r.state = 'running' AND r.cancel_requested_at IS NULL
     GROUP BY t.executor_kind
), run AS (
    SELECT r.priority, r.concurrency,
           (SELECT count(*) FROM tasks q
             WHERE q.run_id = r.id AND q.state IN ('queued', 'running') AND q.map_over IS NULL)
               AS in_flight
      FROM runs r WHERE r.id = $1
)
SELECT t.key, CASE WHEN t.state = 'queued' THEN coalesce(
    exhausted.why,
    (SELECT format('preferring %s until %s', concat_ws(' with ',
                       CASE WHEN d.sticky_worker IS NOT NULL
                            THEN format('its sticky worker %s', d.sticky_worker) END,
                       CASE WHEN cardinality(d.preferred_labels) > 0
                            THEN format('labels %s', array_to_string(d.preferred_labels, ', ')) END),
                   d.prefer_until)
       FROM dispatches d
      WHERE d.task_id = t.id AND d.state = 'pending' AND d.prefer_until > clock_timestamp()),
    '') ELSE coalesce(
    (SELECT format('waiting for concurrency key %L (%s of %s held)', k.key, h.n, k.max)
       FROM unnest(t.concurrency_keys, t.concurrency_max) AS k (key, max)
       JOIN held h ON h.key = k.key
      WHERE h.n >= k.max LIMIT 1),
    (SELECT CASE WHEN l.paused
                 THEN format('waiting for rate limit %L (paused by a slow-down until %s)',
                             l.name, l.paused_until)
                 ELSE format('waiting for rate limit %L (%s of %s units used in the last %s ms; needs %s)',
                             l.name, l.used, l.units, l.period_ms, u.units) END
       FROM unnest(t.rate_names, t.rate_units) AS u (name, units)
       JOIN rates l ON l.name = u.name
      WHERE l.paused OR l.units - l.used < u.units LIMIT 1),
    (SELECT format('waiting for the run''s concurrency (%s of %s)', run.in_flight, run.concurrency)
       FROM run WHERE run.concurrency > 0 AND run.in_flight >= run.concurrency),
    (SELECT format('waiting behind higher-priority work (priority %s of %s aged %s ms; '
                   '%s ranks ahead until it has waited %s ms)',
                   p.base + p.aged, p.base, p.waited, a.top, (a.top - p.base) * $2::bigint)
       FROM run
       CROSS JOIN LATERAL (
           SELECT greatest($3::int, least($4::int, run.priority + t.priority)) AS base,
                  coalesce((extract(epoch FROM clock_timestamp() - t.ready_at) * 1000)::bigint, 0)
                      AS waited,
                  coalesce(floor(extract(epoch FROM clock_timestamp() - t.ready_at) * 1000
                                 / $2::bigint)::int, 0) AS aged) p
       JOIN ahead a ON a.executor_kind = t.executor_kind
      WHERE p.base + p.aged < a.top),
    (SELECT format('waiting for a worker that runs executor kind %L', t.executor_kind)
      WHERE NOT EXISTS (SELECT 1 FROM workers w
                         WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds))),
    -- Placement (placement_fits): a label no active worker of its kind has, all of them
    -- on no one worker, or a resource no such worker has enough of.
    (SELECT format('no active worker with label %s', l.label)
       FROM unnest(t.required_labels) AS l (label)
      WHERE NOT EXISTS (SELECT 1 FROM workers w
                         WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                           AND l.label = ANY(w.placement_labels))
      LIMIT 1),
    (SELECT format('no active worker with labels %s together',
                   array_to_string(t.required_labels, ', '))
      WHERE cardinality(t.required_labels) > 1
        AND NOT EXISTS (SELECT 1 FROM workers w
                         WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                           AND t.required_labels <@ w.placement_labels)),
    (SELECT format('no active worker with %s units of resource %s%s', u.units, u.name,
                   CASE WHEN cardinality(t.required_labels) > 0
                        THEN ' and labels ' || array_to_string(t.required_labels, ', ') ELSE '' END)
       FROM unnest(t.resource_names, t.resource_units) AS u (name, units)
      WHERE NOT EXISTS (SELECT 1 FROM workers w
                         WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                           AND t.required_labels <@ w.placement_labels
                           AND placement_fits('{}', ARRAY[u.name], ARRAY[u.units],
                                              '{}', w.resource_names, w.resource_units))
      LIMIT 1),
    exhausted.why,
    '') END AS why
  FROM tasks t
  -- A resource it reserves that no worker fitting it has free now: reserved of capacity
  -- summed over those workers.
  LEFT JOIN LATERAL (
      SELECT format('resource %L exhausted (%s of %s reserved on the matching workers)',
                    u.name, sum(coalesce(x.n, 0)), sum(c.units)) AS why
        FROM unnest(t.resource_names, t.resource_units) AS u (name, units)
        JOIN workers w ON w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds)
                      AND placement_fits(t.required_labels, t.resource_names, t.resource_units,
                                         w.placement_labels, w.resource_names, w.resource_units)
       CROSS JOIN LATERAL unnest(w.resource_names, w.resource_units) AS c (name, units)
        LEFT JOIN reserved x ON x.worker_id = w.id AND x.name = u.name
       WHERE c.name = u.name
       GROUP BY u.name, u.units
      HAVING bool_and(c.units - coalesce(x.n, 0) < u.units)
       LIMIT 1) exhausted ON true
 WHERE t.run_id = $1 AND t.state IN ('ready', 'queued')
