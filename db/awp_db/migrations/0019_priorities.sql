-- Priorities with aging (docs/workflows.md "Priorities", docs/design.md §17).
--
-- A run's priority and a task's (its workflow definition's) add up to the task's base
-- priority; the grant (awp_db.grant, under the dispatch lock) raises a ready task's
-- base by one level per aging step it has waited since ready_at, up to the highest base
-- among the candidates, and grants the higher effective priority first. Each dispatch
-- records the effective priority it was granted at, so the order of one pass can be
-- checked from the history (tests/kit/invariants/priorities.py).
ALTER TABLE runs
    ADD COLUMN priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10);
ALTER TABLE tasks
    ADD COLUMN priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10);
ALTER TABLE dispatches ADD COLUMN priority integer;
COMMENT ON COLUMN runs.priority IS
    'The run''s priority (-10..10, 0 by default), added to each of its tasks'' own.';
COMMENT ON COLUMN tasks.priority IS
    'The task''s priority from its workflow definition (-10..10), added to its run''s.';
COMMENT ON COLUMN dispatches.priority IS
    'The effective priority the grant ranked the task at (base plus aging); NULL: granted before priorities.';
-- The grant reads each run's ready tasks highest task priority first, then in order, so
-- that its per-run LIMIT keeps the highest (grant.sql: candidates). It replaces
-- tasks_ready (run_id, id), which only that read used.
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready_ranked ON tasks (run_id, priority DESC, id) WHERE state = 'ready';
COMMENT ON INDEX tasks_ready_ranked IS
    'Dispatch reads each run''s ready tasks by task priority, then in id order, from here.';
