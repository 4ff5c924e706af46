-- Dynamic work inside a versioned DAG (docs/workflows.md): map fan-out, failure policies
-- and always tasks.
--
-- A map task's elements are rows of this same table, created (READY) in the transaction
-- that accepts the success of the map task's upstream, keyed "<map key>[<index>]": every
-- mechanism a task has -- dispatch, claim, attempts, leases, fencing, retry timers, the
-- reaper, cancellation, the run's concurrency limit and the dispatcher's fairness -- is
-- then an element's too, with no second code path. The map task's own row is the
-- container: RUNNING (with no dispatch and no attempt) while its elements run, and it
-- counts them down, so that the last success is noticed without a scan.
ALTER TABLE tasks
    ADD COLUMN map_over text,
    ADD COLUMN map_path text[],
    ADD COLUMN map_size integer CHECK (map_size >= 0),
    ADD COLUMN elements_left integer CHECK (elements_left >= 0),
    ADD COLUMN parent_id bigint REFERENCES tasks (id) ON DELETE CASCADE,
    ADD COLUMN map_index integer CHECK (map_index >= 0),
    ADD COLUMN on_failure text NOT NULL DEFAULT 'fail_run'
        CHECK (on_failure IN ('fail_run', 'continue')),
    ADD COLUMN always boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT tasks_map_defined CHECK ((map_over IS NULL) = (map_path IS NULL)),
    ADD CONSTRAINT tasks_map_expanded CHECK (
        (map_size IS NULL) = (elements_left IS NULL)
        AND (map_size IS NULL OR (map_over IS NOT NULL AND elements_left <= map_size))),
    ADD CONSTRAINT tasks_element CHECK ((parent_id IS NULL) = (map_index IS NULL)),
    ADD CONSTRAINT tasks_element_not_a_map CHECK (parent_id IS NULL OR map_over IS NULL);

-- A map task's elements in index order (its output, stopping them), and the foreign key's
-- own index.
CREATE UNIQUE INDEX tasks_elements ON tasks (parent_id, map_index) WHERE parent_id IS NOT NULL;

COMMENT ON COLUMN tasks.map_over IS
    'A map task: the upstream task (one of depends_on) whose output holds the list.';
COMMENT ON COLUMN tasks.map_path IS
    'A map task: the path to the list in that output (jsonb #> path).';
COMMENT ON COLUMN tasks.map_size IS
    'A map task that has started: its number of elements.';
COMMENT ON COLUMN tasks.elements_left IS
    'A map task that has started: elements not yet succeeded; it succeeds at 0.';
COMMENT ON COLUMN tasks.parent_id IS
    'An element of a map task: that task (the element''s key is "<its key>[<map_index>]").';
COMMENT ON COLUMN tasks.map_index IS
    'An element of a map task: its 0-based index in the list (also input.index).';
COMMENT ON COLUMN tasks.on_failure IS
    'What the task''s permanent failure does: fail_run stops the run; continue skips only its downstream.';
COMMENT ON COLUMN tasks.always IS
    'Runs once every other task is terminal (not on cancel); never in another task''s dependents.';
COMMENT ON INDEX tasks_elements IS
    'A map task''s elements in index order: its output, and stopping them when it fails.';
