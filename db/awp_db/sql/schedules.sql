-- Schedules (migration 0014, docs/schedules.md): their rows, and the ticks they fire.
-- The statement that locks schedule rows is in locks.sql (schedules).

-- name: now
SELECT clock_timestamp()

-- name: insert
-- Nothing when the name is taken.
INSERT INTO schedules (name, workflow_name, workflow_version, input, cron, interval_ms,
                       timezone, overlap, catchup, catchup_window_ms, paused, next_tick_at,
                       created_by, updated_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)
ON CONFLICT (name) DO NOTHING
RETURNING *

-- name: update
UPDATE schedules
   SET workflow_name = $2, workflow_version = $3, input = $4, cron = $5, interval_ms = $6,
       timezone = $7, overlap = $8, catchup = $9, catchup_window_ms = $10, paused = $11,
       next_tick_at = $12, updated_at = now(), updated_by = $13
 WHERE name = $1
RETURNING *

-- name: set_paused
-- Resuming fires from the next tick after now ($3): ticks while paused are not due.
UPDATE schedules
   SET paused = $2, next_tick_at = CASE WHEN $2 THEN next_tick_at ELSE $3 END,
       updated_at = now(), updated_by = $4
 WHERE name = $1
RETURNING *

-- name: get
SELECT * FROM schedules WHERE name = $1

-- name: list
-- By name, after $1 (the previous page's last), $2 of them.
SELECT * FROM schedules WHERE name > $1 ORDER BY name LIMIT $2

-- name: delete
DELETE FROM schedules WHERE name = $1 RETURNING id

-- name: due
-- The coordinator's candidates, unlocked (index schedules_due): schedules whose next
-- tick has come, and schedules whose buffered tick can start (no run of theirs running).
(SELECT id FROM schedules
  WHERE NOT paused AND next_tick_at <= clock_timestamp()
  ORDER BY next_tick_at LIMIT $1)
UNION
(SELECT b.schedule_id FROM schedule_ticks b
  WHERE b.outcome = 'buffered'
    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.schedule_id = b.schedule_id AND r.state = 'running')
  LIMIT $1)

-- name: running_runs
SELECT id FROM runs WHERE schedule_id = $1 AND state = 'running' ORDER BY id

-- name: buffered_tick
SELECT tick_at FROM schedule_ticks WHERE schedule_id = $1 AND outcome = 'buffered'

-- name: insert_fenced_tick
-- A tick fired by the leading coordinator: inserted only while ($4 holder, $5 epoch)
-- still holds the leader row, and only once per (schedule, tick). The caller's
-- transaction already holds that term (locks.leader_term) until it commits; reading the
-- epoch from the row here records the term that created the tick from the row itself.
INSERT INTO schedule_ticks (schedule_id, tick_at, source, leader_epoch, outcome)
SELECT $1, $2, 'schedule', l.epoch, $3
  FROM coordinator_leader l
 WHERE l.holder = $4 AND l.epoch = $5
ON CONFLICT (schedule_id, tick_at) DO NOTHING
RETURNING tick_at

-- name: insert_requested_tick
-- A tick a request creates (TriggerSchedule, BackfillSchedule: $3), once per
-- (schedule, tick) all the same.
INSERT INTO schedule_ticks (schedule_id, tick_at, source, outcome)
VALUES ($1, $2, $3, 'started')
ON CONFLICT (schedule_id, tick_at) DO NOTHING
RETURNING tick_at

-- name: set_tick_run
UPDATE schedule_ticks SET outcome = 'started', run_id = $3
 WHERE schedule_id = $1 AND tick_at = $2

-- name: advance
UPDATE schedules SET next_tick_at = $2 WHERE id = $1

-- name: recent_ticks
-- The newest $2 ticks of a schedule.
SELECT tick_at, source, leader_epoch, outcome, run_id, created_at
  FROM schedule_ticks WHERE schedule_id = $1
 ORDER BY tick_at DESC LIMIT $2
