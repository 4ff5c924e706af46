-- Retention: deleting finished runs past an age with every row that belongs to them
-- (awp_db.retention). The runs are locked first (locks.sql expired_runs); their rows go
-- child-first, each table through its run_id index, so that the foreign keys' cascades
-- (checked per deleted row) find nothing left to delete.

-- name: cutoff
-- Runs that finished before this instant are past an age of $1 ms: the database clock,
-- on which finished_at was written.
SELECT clock_timestamp() - $1::bigint * interval '1 millisecond'

-- name: delete_stream_chunks
-- Through the dispatches' run_id index and the chunks' primary key (dispatch_id first).
DELETE FROM stream_chunks
 WHERE dispatch_id IN (SELECT id FROM dispatches WHERE run_id = ANY($1::uuid[]))

-- name: delete_attempts
WITH gone AS (DELETE FROM attempts WHERE run_id = ANY($1::uuid[]) RETURNING 1)
SELECT count(*) FROM gone

-- name: delete_dispatches
WITH gone AS (DELETE FROM dispatches WHERE run_id = ANY($1::uuid[]) RETURNING 1)
SELECT count(*) FROM gone

-- name: delete_state_events
WITH gone AS (DELETE FROM state_events WHERE run_id = ANY($1::uuid[]) RETURNING 1)
SELECT count(*) FROM gone

-- name: delete_tasks
WITH gone AS (DELETE FROM tasks WHERE run_id = ANY($1::uuid[]) RETURNING 1)
SELECT count(*) FROM gone

-- name: delete_schedule_ticks
-- The ticks that started the runs $1 (through the schedule's primary key), and up to $3
-- ticks skipped (overlap) before $2: a tick older than retention's age is forgotten with
-- its run. Buffered ticks stay whatever their age: they are work not yet started.
WITH gone AS (
    DELETE FROM schedule_ticks t
     USING runs r
     WHERE r.id = ANY($1::uuid[])
       AND t.schedule_id = r.schedule_id AND t.tick_at = r.schedule_tick AND t.run_id = r.id
    RETURNING 1
), skipped AS (
    DELETE FROM schedule_ticks
     WHERE ctid = ANY(ARRAY(SELECT ctid FROM schedule_ticks
                             WHERE outcome = 'skipped' AND tick_at < $2 LIMIT $3))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM skipped)

-- name: delete_runs
WITH gone AS (DELETE FROM runs WHERE id = ANY($1::uuid[]) RETURNING 1)
SELECT count(*) FROM gone

-- name: backlog
-- How many runs finished before $1 are still stored, after the position ($2 finished_at,
-- $3 id) in retention's order (from the start when both are NULL). An index-only count.
SELECT count(*) FROM runs
 WHERE finished_at < $1
   AND (finished_at, id) > (coalesce($2, '-infinity'::timestamptz),
                            coalesce($3, '00000000-0000-0000-0000-000000000000'::uuid))

-- name: survey
-- A dry run's page: the next $4 runs finished before $1 after the position ($2, $3) as
-- in backlog, what they hold, and the position of the last one (NULL if none). Unlocked:
-- a count, not a promise.
WITH page AS (
    SELECT id, finished_at FROM runs
     WHERE finished_at < $1
       AND (finished_at, id) > (coalesce($2, '-infinity'::timestamptz),
                                coalesce($3, '00000000-0000-0000-0000-000000000000'::uuid))
     ORDER BY finished_at, id
     LIMIT $4
)
SELECT (SELECT count(*) FROM page) AS runs,
       (SELECT count(*) FROM tasks WHERE run_id IN (SELECT id FROM page)) AS tasks,
       (SELECT count(*) FROM attempts WHERE run_id IN (SELECT id FROM page)) AS attempts,
       (SELECT count(*) FROM dispatches WHERE run_id IN (SELECT id FROM page)) AS dispatches,
       (SELECT count(*) FROM state_events WHERE run_id IN (SELECT id FROM page)) AS state_events,
       (SELECT count(*) FROM schedule_ticks t JOIN runs r
            ON t.schedule_id = r.schedule_id AND t.tick_at = r.schedule_tick AND t.run_id = r.id
         WHERE r.id IN (SELECT id FROM page)) AS schedule_ticks,
       last.finished_at AS last_finished_at, last.id AS last_id
  FROM (SELECT 1) AS one
  LEFT JOIN (SELECT finished_at, id FROM page ORDER BY finished_at DESC, id DESC LIMIT 1)
            AS last ON true
