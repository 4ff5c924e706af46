-- The coordinator's own reads and writes (DESIGN.md §7). Everything else it does goes
-- through settle, leases and dispatching, so one rule has one implementation.
--
-- Candidates are selected without locks; the statements that change anything re-check
-- their condition under the lock (locks.sql) against clock_timestamp(), because two
-- coordinators may run the same pass at once and a heartbeat may renew a lease in between.

-- name: cancel_requested
-- Runs whose cancellation has not converged yet (index runs_cancel_pending).
SELECT id FROM runs
 WHERE state = 'running' AND cancel_requested_at IS NOT NULL
 ORDER BY id
 LIMIT $1

-- name: expired_leases
-- Reaper candidates, unlocked: leases past their expiry or their attempt's deadline.
(SELECT id, run_id FROM dispatches
  WHERE state = 'leased' AND lease_expires_at <= clock_timestamp()
  ORDER BY lease_expires_at LIMIT $1)
UNION
(SELECT id, run_id FROM dispatches
  WHERE state = 'leased' AND attempt_deadline <= clock_timestamp()
  ORDER BY attempt_deadline LIMIT $1)

-- name: due_retries
-- Retry timers that have fired, unlocked (index tasks_retry_due).
SELECT id, run_id FROM tasks
 WHERE state = 'waiting_retry' AND retry_at <= clock_timestamp()
 ORDER BY retry_at
 LIMIT $1

-- name: release_retries
-- Runs are locked by the caller; only tasks of running runs still waiting and due move.
UPDATE tasks t
   SET state = 'ready', retry_at = NULL, ready_at = clock_timestamp()
 WHERE t.id = ANY($1::bigint[]) AND t.run_id = ANY($2::uuid[])
   AND t.state = 'waiting_retry' AND t.retry_at <= clock_timestamp()
RETURNING t.run_id, t.key, t.attempts

-- name: finishable_runs
-- Runs still running with no unfinished task but always tasks waiting for their turn
-- (settle.finish_runs releases those): settlement finishes runs itself, this is the
-- safety sweep for any that slipped through.
SELECT r.id FROM runs r
 WHERE r.state = 'running'
   AND NOT EXISTS (
       SELECT 1 FROM tasks t
        WHERE t.run_id = r.id
          AND t.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting')
          AND NOT (t.always AND t.state = 'pending'))
 ORDER BY r.id
 LIMIT $1

-- name: due
-- A pass's first read: which kinds of work have candidates now (each the exact
-- condition of that step's candidate query; the steps re-check under their locks),
-- whether any task is ready, and the seconds until the earliest lease expiry, attempt
-- deadline, retry timer, wait's due time (a sleep's end, a wait's timeout), delayed start, schedule tick or worker silence threshold ($1 of a session's own heartbeat
-- intervals and at least $2 ms, counted from the later of its last heartbeat and
-- heartbeat_silence_from(), as locks.silent_sessions), NULL when none is pending.
-- The difference is taken on the database clock, so the coordinator's clock never
-- matters. Unlocked, index-only work.
SELECT EXISTS (SELECT 1 FROM runs
                WHERE state = 'running' AND cancel_requested_at IS NOT NULL) AS cancels,
       EXISTS (SELECT 1 FROM workers
                WHERE state IN ('active', 'draining')
                  AND greatest(last_heartbeat_at, (SELECT heartbeat_silence_from()))
                      < clock_timestamp()
                      - greatest($1::int * heartbeat_interval_ms, $2::bigint) * interval '1 millisecond')
           AS silent_workers,
       (EXISTS (SELECT 1 FROM dispatches
                 WHERE state = 'leased' AND lease_expires_at <= clock_timestamp())
        OR EXISTS (SELECT 1 FROM dispatches
                    WHERE state = 'leased' AND attempt_deadline <= clock_timestamp()))
           AS expired_leases,
       EXISTS (SELECT 1 FROM tasks
                WHERE state = 'waiting_retry' AND retry_at <= clock_timestamp()) AS retries,
       -- dispatching.sql: unservable's condition (placement_fits, migration 0020).
       EXISTS (SELECT 1 FROM dispatches d
                WHERE d.state = 'pending'
                  AND NOT EXISTS (SELECT 1 FROM workers w
                                   WHERE w.state = 'active' AND d.executor_kind = ANY(w.executor_kinds)
                                     AND (NOT d.placed
                                          OR placement_fits(d.required_labels, d.resource_names,
                                                            d.resource_units, w.placement_labels,
                                                            w.resource_names, w.resource_units))))
           AS unservable,
       EXISTS (SELECT 1 FROM tasks WHERE state = 'ready') AS ready,
       EXISTS (SELECT 1 FROM tasks
                WHERE state = 'waiting' AND wait_due_at <= clock_timestamp()) AS waits,
       EXISTS (SELECT 1 FROM tasks
                WHERE state = 'ready' AND wait_task IS NOT NULL) AS wait_tasks,
       -- Delayed starts whose time has come, and schedules with a due tick or a
       -- buffered tick free to start (the same conditions as due_starts and
       -- schedules.sql: due).
       EXISTS (SELECT 1 FROM runs WHERE awaiting_start AND start_at <= clock_timestamp())
           AS starts,
       (EXISTS (SELECT 1 FROM schedules WHERE NOT paused AND next_tick_at <= clock_timestamp())
        OR EXISTS (SELECT 1 FROM schedule_ticks b
                    WHERE b.outcome = 'buffered'
                      AND NOT EXISTS (SELECT 1 FROM runs r
                                       WHERE r.schedule_id = b.schedule_id AND r.state = 'running')))
           AS schedules,
       -- Some kind has fewer pending dispatches (without placement requirements, as
       -- dispatching.sql: capacity counts them) than free slots plus half the prefetch
       -- ($3): the only case in which dispatching.create_dispatches creates any
       -- (grant.refill_due, the same arithmetic).
       EXISTS (SELECT 1
                 FROM workers w
                 CROSS JOIN LATERAL unnest(w.executor_kinds) AS k (kind)
                WHERE w.state = 'active'
                GROUP BY k.kind
               HAVING sum(greatest(w.max_concurrency
                                   - (SELECT count(*) FROM dispatches l
                                       WHERE l.worker_id = w.id AND l.state = 'leased'), 0))
                      + ceil($3::float8 * sum(w.max_concurrency)::float8 / 2)
                      > (SELECT count(*) FROM dispatches p
                          WHERE p.state = 'pending' AND p.executor_kind = k.kind
                            AND cardinality(p.required_labels) = 0
                            AND cardinality(p.resource_names) = 0))
           AS short,
       extract(epoch FROM least(
           (SELECT min(lease_expires_at) FROM dispatches WHERE state = 'leased'),
           (SELECT min(attempt_deadline) FROM dispatches WHERE state = 'leased'),
           (SELECT min(retry_at) FROM tasks WHERE state = 'waiting_retry'),
           (SELECT min(wait_due_at) FROM tasks WHERE state = 'waiting'),
           (SELECT min(start_at) FROM runs WHERE awaiting_start),
           (SELECT min(next_tick_at) FROM schedules WHERE NOT paused),
           (SELECT min(greatest(last_heartbeat_at, (SELECT heartbeat_silence_from()))
                       + greatest($1::int * heartbeat_interval_ms, $2::bigint) * interval '1 millisecond')
              FROM workers WHERE state IN ('active', 'draining'))
       ) - clock_timestamp())::float8 AS next_due_in

-- name: due_starts
-- Delayed runs whose start time has come, unlocked (index runs_awaiting_start).
SELECT id FROM runs
 WHERE awaiting_start AND start_at <= clock_timestamp()
 ORDER BY start_at
 LIMIT $1

-- name: release_starts
-- Runs are locked by the caller. A running run's roots become ready (the start time was
-- the one thing they still waited for: runs.sql, insert_tasks); a run that ended while
-- it waited (canceled) only stops waiting.
WITH released AS (
    UPDATE runs SET awaiting_start = false
     WHERE id = ANY($1::uuid[]) AND awaiting_start AND start_at <= clock_timestamp()
    RETURNING id, state)
UPDATE tasks t
   SET state = 'ready', unfinished_deps = 0, ready_at = clock_timestamp()
  FROM released r
 WHERE t.run_id = r.id AND r.state = 'running'
   AND t.state = 'pending' AND cardinality(t.depends_on) = 0 AND NOT t.always
   AND t.parent_id IS NULL
RETURNING t.run_id, t.key
