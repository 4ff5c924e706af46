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
-- Rate limits: a task is a candidate only while each rate limit it uses, if set, is not
-- paused and has its units free in the window ending now (charges granted in the last
-- period, each its reported usage where known, else its estimate). `rate_free` returns
-- each one's free units (NULL: no such limit, unbounded); the caller counts its own.
-- Each run's tasks are read from its first ready one on (first_ready, found in the
-- tasks_ready index; the range on run_id keeps that lookup on it): once statistics
-- exist, an unbounded "run_id = ... ORDER BY id LIMIT" is planned as a walk of the
-- primary key over every task of every earlier run (run and id correlate), which
-- costs a pass ~15 ms with 10 runs of 1,000 tasks instead of ~1.
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
), live AS (
    SELECT r.id, r.concurrency, r.last_dispatched_at, r.created_at,
           (SELECT count(*) FROM tasks q
             WHERE q.run_id = r.id AND q.state IN ('queued', 'running')
               AND q.map_over IS NULL) AS in_flight,
           (SELECT f.id FROM tasks f
             WHERE f.run_id >= r.id AND f.run_id <= r.id AND f.state = 'ready'
             ORDER BY f.run_id, f.id
             LIMIT 1) AS first_ready
      FROM runs r
     WHERE r.state = 'running' AND r.cancel_requested_at IS NULL
       AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id AND t.state = 'ready')
), picked AS (
    SELECT c.*, l.last_dispatched_at, l.created_at, l.id AS live_id
      FROM live l
      CROSS JOIN LATERAL (
          SELECT t.id, t.run_id, t.executor_kind, t.concurrency_keys, t.concurrency_max,
                 u.held, t.rate_names, t.rate_units, v.rate_free,
                 row_number() OVER (ORDER BY t.id) AS rn
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
           WHERE t.run_id = l.id AND t.state = 'ready' AND t.id >= l.first_ready
             AND t.executor_kind = ANY($1::text[]) AND u.open AND v.open
           ORDER BY t.id
           LIMIT $2) c
     WHERE l.concurrency = 0 OR c.rn <= l.concurrency - l.in_flight
), ranked AS (
    SELECT p.*,
           CASE WHEN cardinality(p.concurrency_keys) = 0 THEN p.rn
                ELSE row_number() OVER (
                    PARTITION BY p.concurrency_keys[1]
                    ORDER BY p.rn, p.last_dispatched_at NULLS FIRST, p.created_at, p.live_id, p.id)
           END AS turn
      FROM picked p
)
SELECT id, run_id, executor_kind, concurrency_keys, concurrency_max, held, rate_names,
       rate_units, rate_free
  FROM ranked
 WHERE cardinality(concurrency_keys) = 0 OR turn <= concurrency_max[1] - held[1]
 ORDER BY turn, rn, last_dispatched_at NULLS FIRST, created_at, live_id, id
 LIMIT $2

-- name: explain
-- Why each ready task of run $1 is not granted now, by the same counts as `candidates`
-- (the first reason found; a task with none is only waiting for the next pass or a free
-- slot). Unlocked: a reading, not a decision.
WITH held AS (
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
), run AS (
    SELECT r.concurrency,
           (SELECT count(*) FROM tasks q
             WHERE q.run_id = r.id AND q.state IN ('queued', 'running') AND q.map_over IS NULL)
               AS in_flight
      FROM runs r WHERE r.id = $1
)
SELECT t.key, coalesce(
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
    (SELECT format('waiting for a worker that runs executor kind %L', t.executor_kind)
      WHERE NOT EXISTS (SELECT 1 FROM workers w
                         WHERE w.state = 'active' AND t.executor_kind = ANY(w.executor_kinds))),
    '') AS why
  FROM tasks t
 WHERE t.run_id = $1 AND t.state = 'ready'
