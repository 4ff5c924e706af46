-- Retention (docs/design.md §7, docs/retention.md): the leading coordinator deletes finished
-- runs past the retention age, oldest first, a small batch per transaction, with every
-- row that belongs to them (awp_db.retention).

-- The candidates, oldest first, without reading every run; id breaks ties so that a
-- dry run can page through them (and makes the order total). The coordinator's
-- run-outcome gauges read the runs of the last few minutes from here too (sql/stats.sql).
CREATE INDEX runs_finished ON runs (finished_at, id) WHERE finished_at IS NOT NULL;

COMMENT ON INDEX runs_finished IS
    'Retention reads the finished runs past the retention age from here, oldest first.';

-- Deleting a task makes PostgreSQL look up the dispatches referencing it (the foreign
-- key dispatches.task_id, ON DELETE CASCADE), once per task. The partial index of live
-- dispatches cannot serve that lookup: without this one each deleted task would scan
-- every dispatch.
CREATE INDEX dispatches_task ON dispatches (task_id);

COMMENT ON INDEX dispatches_task IS
    'The foreign key dispatches.task_id: deleting a task (retention) finds its dispatches here, not by a scan.';
