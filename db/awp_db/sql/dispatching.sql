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
    SELECT executor_kind AS kind, count(*) AS n
      FROM dispatches WHERE state = 'pending'
     GROUP BY executor_kind
)
SELECT coalesce(s.kind, p.kind) AS kind,
       coalesce(s.free, 0)::bigint AS free,
       coalesce(s.slots, 0)::bigint AS slots,
       coalesce(p.n, 0)::bigint AS pending,
       (SELECT coalesce(sum(n), 0) FROM leased)::bigint AS leased
  FROM slots s FULL JOIN pending p ON p.kind = s.kind

-- name: candidates
-- Ready tasks of runs not being canceled, round-robin across runs: every run's first
-- task, then every run's second... Runs never dispatched come first, then the least
-- recently dispatched. Each run stays within its own concurrency (queued + running; a
-- running map task is not counted, its elements are).
-- Each run's tasks are read from its first ready one on (first_ready, found in the
-- tasks_ready index; the range on run_id keeps that lookup on it): once statistics
-- exist, an unbounded "run_id = ... ORDER BY id LIMIT" is planned as a walk of the
-- primary key over every task of every earlier run (run and id correlate), which
-- costs a pass ~15 ms with 10 runs of 1,000 tasks instead of ~1.
WITH live AS (
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
)
SELECT c.id, c.run_id, c.executor_kind, c.rn
  FROM live l
  CROSS JOIN LATERAL (
      SELECT t.id, t.run_id, t.executor_kind, row_number() OVER (ORDER BY t.id) AS rn
        FROM tasks t
       WHERE t.run_id = l.id AND t.state = 'ready' AND t.id >= l.first_ready
         AND t.executor_kind = ANY($1::text[])
       ORDER BY t.id
       LIMIT $2) c
 WHERE l.concurrency = 0 OR c.rn <= l.concurrency - l.in_flight
 ORDER BY c.rn, l.last_dispatched_at NULLS FIRST, l.created_at, l.id
 LIMIT $2

-- name: create
-- Runs are locked by the caller (locks.sql). Only tasks still ready move; each gets one dispatch
-- (the unique index refuses a second live one).
WITH moved AS (
    UPDATE tasks t SET state = 'queued'
     WHERE t.id = ANY($1::bigint[]) AND t.state = 'ready'
 RETURNING t.id, t.run_id, t.key, t.executor_kind
), created AS (
    INSERT INTO dispatches (run_id, task_id, executor_kind)
    SELECT run_id, id, executor_kind FROM moved
 RETURNING id, task_id
), touched AS (
    UPDATE runs SET last_dispatched_at = clock_timestamp()
     WHERE id IN (SELECT run_id FROM moved)
)
SELECT m.run_id, m.key, m.executor_kind, c.id AS dispatch_id
  FROM moved m JOIN created c ON c.task_id = m.id

-- name: unservable
-- Pending dispatches no active worker could claim.
SELECT d.id, d.run_id
  FROM dispatches d
 WHERE d.state = 'pending'
   AND NOT EXISTS (SELECT 1 FROM workers w
                    WHERE w.state = 'active' AND d.executor_kind = ANY(w.executor_kinds))
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
