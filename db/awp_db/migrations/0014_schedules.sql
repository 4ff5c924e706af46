-- Schedules and delayed start (docs/schedules.md, DESIGN rules in docs/design.md §14).
--
-- A schedule names a workflow, an input and a cadence (a cron expression in an IANA
-- zone, or an interval); the leading coordinator fires its ticks. Each fired tick is a
-- row of schedule_ticks, keyed by (schedule, tick instant), created in a transaction
-- fenced by the leader's epoch: a tick fires once whatever fails, and a coordinator that
-- lost leadership cannot create one (awp_db.schedules).
CREATE TABLE schedules (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name text NOT NULL UNIQUE,
    workflow_name text NOT NULL,
    workflow_version integer NOT NULL DEFAULT 0 CHECK (workflow_version >= 0),
    input jsonb NOT NULL DEFAULT '{}',
    cron text,
    interval_ms bigint CHECK (interval_ms > 0),
    timezone text NOT NULL DEFAULT 'UTC',
    overlap text NOT NULL
        CHECK (overlap IN ('skip', 'buffer_one', 'allow_all', 'cancel_previous')),
    catchup text NOT NULL CHECK (catchup IN ('none', 'last', 'all')),
    catchup_window_ms bigint NOT NULL CHECK (catchup_window_ms > 0),
    paused boolean NOT NULL DEFAULT false,
    next_tick_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL,
    CONSTRAINT schedules_one_cadence CHECK ((cron IS NULL) <> (interval_ms IS NULL))
);

-- The coordinator's scan: the earliest next tick of a live schedule.
CREATE INDEX schedules_due ON schedules (next_tick_at) WHERE NOT paused;

COMMENT ON TABLE schedules IS
    'Workflows started on a clock: a cron expression in a time zone, or an interval (docs/schedules.md).';
COMMENT ON COLUMN schedules.workflow_version IS '0: the latest version at each tick.';
COMMENT ON COLUMN schedules.next_tick_at IS
    'The earliest tick not yet considered; the leading coordinator advances it in the transaction that fires the ticks before it.';

CREATE TABLE schedule_ticks (
    schedule_id uuid NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    tick_at timestamptz NOT NULL,
    source text NOT NULL CHECK (source IN ('schedule', 'trigger', 'backfill')),
    -- The leader term that created a 'schedule' tick; a trigger or a backfill is
    -- created by a server answering a request, outside any term.
    leader_epoch bigint,
    outcome text NOT NULL CHECK (outcome IN ('started', 'skipped', 'buffered')),
    run_id uuid,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (schedule_id, tick_at),
    CONSTRAINT schedule_ticks_fenced CHECK ((source = 'schedule') = (leader_epoch IS NOT NULL)),
    -- A started tick gets its run in the transaction that inserts it (the invariant
    -- checker verifies it has one).
    CONSTRAINT schedule_ticks_run_of_started CHECK (run_id IS NULL OR outcome = 'started')
);

-- At most one tick per schedule waits for its previous run (overlap buffer_one).
CREATE UNIQUE INDEX schedule_ticks_buffered ON schedule_ticks (schedule_id)
    WHERE outcome = 'buffered';

COMMENT ON TABLE schedule_ticks IS
    'One row per fired tick, unique per (schedule, tick): started a run, skipped (overlap) or buffered until the previous run ends.';
COMMENT ON COLUMN schedule_ticks.seq IS
    'Creation order: a tick created under an older epoch than an earlier tick would be a stale leader''s (the invariant checker looks).';

-- A run records the schedule and tick that started it (plain ids, like retried_from:
-- deleting the schedule keeps the runs' history), and a delayed start.
ALTER TABLE runs
    ADD COLUMN schedule_id uuid,
    ADD COLUMN schedule_tick timestamptz,
    ADD COLUMN start_at timestamptz,
    ADD COLUMN awaiting_start boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT runs_schedule_tick_together CHECK ((schedule_id IS NULL) = (schedule_tick IS NULL)),
    ADD CONSTRAINT runs_awaiting_has_start CHECK (NOT awaiting_start OR start_at IS NOT NULL);

-- The second fence of exactly-once: one run per tick, whoever inserts it.
CREATE UNIQUE INDEX runs_schedule_tick ON runs (schedule_id, schedule_tick)
    WHERE schedule_id IS NOT NULL;
-- The overlap policies' question: which runs of this schedule are still running.
CREATE INDEX runs_schedule_running ON runs (schedule_id)
    WHERE schedule_id IS NOT NULL AND state = 'running';
-- The coordinator's scan of delayed starts.
CREATE INDEX runs_awaiting_start ON runs (start_at) WHERE awaiting_start;

COMMENT ON COLUMN runs.schedule_id IS 'The schedule whose tick started the run (NULL: not a schedule''s).';
COMMENT ON COLUMN runs.schedule_tick IS 'The tick (its instant) that started the run.';
COMMENT ON COLUMN runs.start_at IS
    'A delayed start: when the run''s roots become ready, on the database clock (NULL: at once).';
COMMENT ON COLUMN runs.awaiting_start IS
    'True until the coordinator makes the roots of a delayed run ready.';
