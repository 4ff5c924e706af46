-- Durable execution (docs/design.md §16): step checkpoints, and waits that hold no
-- worker slot (signals, approvals, sleeps).
--
-- A checkpoint is a memo of the task, keyed by (kind, name, occurrence): a step's
-- result, or the outcome of a wait once satisfied. An attempt stores one only under its
-- lease (fenced like Complete), a timer or a decision only under the run's lock; a
-- stored checkpoint never changes, and every later attempt replays it instead of
-- running the step again or waiting again.
CREATE TABLE checkpoints (
    task_id bigint NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id uuid NOT NULL,
    kind text NOT NULL CHECK (kind IN ('step', 'sleep', 'signal', 'approval')),
    name text NOT NULL,
    occurrence integer NOT NULL CHECK (occurrence >= 0),
    value jsonb NOT NULL,
    -- UTF-8 bytes of the value as JSON: the per-memo and per-task bounds are checked on it.
    value_bytes integer NOT NULL CHECK (value_bytes >= 0),
    -- What the step reported it cost (steps only; zero otherwise).
    tokens bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    cost_usd double precision NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
    -- A wait that ended by its timeout, not by its condition.
    timed_out boolean NOT NULL DEFAULT false,
    -- The attempt (and its lease) that stored it; NULL for the outcome of a wait written
    -- by a timer or a decision while no attempt ran.
    dispatch_id bigint,
    attempt integer CHECK (attempt >= 1),
    fencing_token bigint,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task_id, kind, name, occurrence),
    CHECK ((dispatch_id IS NULL) = (attempt IS NULL) AND (attempt IS NULL) = (fencing_token IS NULL)),
    CHECK (kind <> 'step' OR dispatch_id IS NOT NULL),
    CHECK (kind = 'step' OR (tokens = 0 AND cost_usd = 0))
);

COMMENT ON TABLE checkpoints IS
    'Memos of a task (step results, satisfied waits), written once under the lease or the run lock; replayed by later attempts.';

-- Signals are rows, not messages: stored when sent (durable, buffered before any wait
-- reaches them), consumed by exactly one wait in the transaction that resumes its task,
-- oldest first per (run, name).
CREATE TABLE signals (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name text NOT NULL,
    payload jsonb NOT NULL,
    request_id text,
    sent_by text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_by_task bigint REFERENCES tasks (id) ON DELETE CASCADE,
    consumed_at timestamptz,
    UNIQUE (run_id, request_id),
    CHECK ((consumed_by_task IS NULL) = (consumed_at IS NULL))
);

CREATE INDEX signals_buffered ON signals (run_id, name, id) WHERE consumed_at IS NULL;

COMMENT ON TABLE signals IS
    'Signals sent to runs: buffered until a wait for their name consumes them, oldest first.';

-- A task that reached a wait not yet satisfied is WAITING: its attempt ended SUSPENDED
-- (no attempt charged, lease released), and the task row says what it waits for.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check CHECK (state IN (
    'pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting',
    'succeeded', 'failed', 'canceled', 'skipped'));
ALTER TABLE attempts DROP CONSTRAINT attempts_state_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_state_check CHECK (state IN (
    'running', 'succeeded', 'failed', 'interrupted', 'timed_out', 'canceled', 'suspended'));

ALTER TABLE tasks
    -- Attempts that ended SUSPENDED: free of charge, like hand_backs.
    ADD COLUMN suspensions integer NOT NULL DEFAULT 0 CHECK (suspensions >= 0),
    -- The wait a WAITING task is in: its kind and name, the occurrence of that wait in
    -- the action, and when it ends without its condition (a sleep's due time, a wait's
    -- timeout), on the database clock.
    ADD COLUMN wait_kind text CHECK (wait_kind IN ('sleep', 'signal', 'approval')),
    ADD COLUMN wait_name text,
    ADD COLUMN wait_occurrence integer CHECK (wait_occurrence >= 0),
    ADD COLUMN wait_prompt text,
    ADD COLUMN wait_role text,
    ADD COLUMN wait_since timestamptz,
    ADD COLUMN wait_due_at timestamptz,
    -- The attempt that suspended (NULL for a wait task no worker runs).
    ADD COLUMN wait_attempt integer,
    -- A task that is a wait of its own (no executor): {"kind": "sleep"|"approval", ...}.
    ADD COLUMN wait_task jsonb,
    -- What replayed memos saved this task's attempts (reported by the attempts that
    -- replayed them): steps not run again, and their reported tokens and cost.
    ADD COLUMN saved_steps integer NOT NULL DEFAULT 0 CHECK (saved_steps >= 0),
    ADD COLUMN saved_tokens bigint NOT NULL DEFAULT 0 CHECK (saved_tokens >= 0),
    ADD COLUMN saved_cost_usd double precision NOT NULL DEFAULT 0 CHECK (saved_cost_usd >= 0),
    ADD CONSTRAINT tasks_waiting CHECK ((state = 'waiting') = (wait_kind IS NOT NULL)),
    ADD CONSTRAINT tasks_wait_named CHECK (wait_kind IS NULL OR wait_name IS NOT NULL AND wait_since IS NOT NULL);

CREATE INDEX tasks_wait_due ON tasks (wait_due_at) WHERE state = 'waiting' AND wait_due_at IS NOT NULL;
CREATE INDEX tasks_waiting_for ON tasks (run_id, wait_kind, wait_name) WHERE state = 'waiting';
