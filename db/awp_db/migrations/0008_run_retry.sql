-- Resume instead of restart (DESIGN.md §13, RetryRun in protos/awp/v1/control.proto): a
-- run started by RetryRun names the run it retried, and each task it did not run again
-- names the run whose attempt produced the output it reused. Plain ids, not foreign keys:
-- they are history, and retention may delete the run they name.
ALTER TABLE runs
    ADD COLUMN retried_from uuid,
    ADD COLUMN retry_from_task text,
    ADD CONSTRAINT runs_retry_from_task_of_a_retry
        CHECK (retry_from_task IS NULL OR retried_from IS NOT NULL);

ALTER TABLE tasks
    ADD COLUMN reused_from_run_id uuid,
    ADD CONSTRAINT tasks_reused_succeeded_without_attempts
        CHECK (reused_from_run_id IS NULL OR (state = 'succeeded' AND attempts = 0));

COMMENT ON COLUMN runs.retried_from IS
    'The run RetryRun retried to start this one (NULL: started by StartRun).';
COMMENT ON COLUMN runs.retry_from_task IS
    'The from_task RetryRun was given: that task and everything downstream of it re-ran (NULL: what had not succeeded re-ran).';
COMMENT ON COLUMN tasks.reused_from_run_id IS
    'Set when the task was not run but reused by RetryRun: the run whose attempt produced its output (through any chain of retries).';
