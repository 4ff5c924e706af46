-- Runs by the time they finished: the coordinator's run-outcome gauges count the runs
-- that finished in the last few minutes (sql/stats.sql, gauges), which without it would
-- read every run kept for the retention period.
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
