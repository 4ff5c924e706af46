-- Waits (docs/design.md §16): a task that leaves WAITING, for whatever reason (its wait
-- satisfied or timed out, a decision, its run canceled or failed), no longer says what
-- it waited for. One trigger rather than a clause in every statement that moves a task,
-- so that no path can forget it (tasks_waiting requires it).
CREATE FUNCTION clear_task_wait() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.wait_kind := NULL;
    NEW.wait_name := NULL;
    NEW.wait_occurrence := NULL;
    NEW.wait_prompt := NULL;
    NEW.wait_role := NULL;
    NEW.wait_since := NULL;
    NEW.wait_due_at := NULL;
    NEW.wait_attempt := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER tasks_wait_cleared
    BEFORE UPDATE OF state ON tasks
    FOR EACH ROW
    WHEN (OLD.state = 'waiting' AND NEW.state <> 'waiting')
    EXECUTE FUNCTION clear_task_wait();

COMMENT ON TRIGGER tasks_wait_cleared ON tasks IS
    'A task leaving WAITING forgets what it waited for (docs/design.md §16).';

-- An attempt that ended SUSPENDED at a wait is free of charge, as a hand-back is: what
-- max_attempts bounds is attempts - hand_backs - suspensions (awp_kernel.retry:
-- charged_attempts). Existing rows have suspensions = 0 and met the old check.
ALTER TABLE tasks
    DROP CONSTRAINT tasks_charged_attempts,
    ADD CONSTRAINT tasks_charged_attempts
        CHECK (attempts - hand_backs - suspensions <= max_attempts) NOT VALID,
    ADD CONSTRAINT tasks_suspensions_made CHECK (hand_backs + suspensions <= attempts) NOT VALID;

COMMENT ON COLUMN tasks.suspensions IS
    'Attempts that ended SUSPENDED at a wait, free of charge; attempts - hand_backs - suspensions <= max_attempts.';

-- Wait tasks (TaskDefinition.wait) the coordinator moves from READY to WAITING.
CREATE INDEX tasks_wait_ready ON tasks (id) WHERE state = 'ready' AND wait_task IS NOT NULL;
