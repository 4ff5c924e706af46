-- AWP schema, version 1. Every state column is CHECKed and every lifecycle invariant
-- that a single row can express is a constraint, so a bug cannot commit a bad state.

CREATE TABLE workflows (
    id              bigserial PRIMARY KEY,
    name            text        NOT NULL CHECK (name ~ '^[A-Za-z0-9_.-]{1,128}$'),
    version         integer     NOT NULL CHECK (version >= 1),
    definition      jsonb       NOT NULL,
    -- SHA-256 of the canonical definition: identical re-creates are idempotent.
    definition_hash bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

CREATE TABLE runs (
    id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    workflow_id         bigint      NOT NULL REFERENCES workflows (id),
    state               text        NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'succeeded', 'failed', 'canceled')),
    revision            bigint      NOT NULL DEFAULT 0 CHECK (revision >= 0),
    last_seq            bigint      NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    input               jsonb       NOT NULL DEFAULT '{}'::jsonb,
    concurrency         integer     NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    request_id          text        UNIQUE CHECK (length(request_id) BETWEEN 1 AND 128),
    created_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    cancel_requested_at timestamptz,
    cancel_reason       text,
    -- Fairness lives here so that it survives coordinator restarts: runs never
    -- dispatched (NULL) first, then least-recently dispatched.
    last_dispatched_at  timestamptz,
    CHECK ((state = 'running') = (finished_at IS NULL))
);
CREATE INDEX runs_running ON runs (last_dispatched_at NULLS FIRST, created_at) WHERE state = 'running';
CREATE INDEX runs_cancel_pending ON runs (id) WHERE state = 'running' AND cancel_requested_at IS NOT NULL;
CREATE INDEX runs_created ON runs (created_at DESC, id DESC);

CREATE TABLE tasks (
    id                 bigserial   PRIMARY KEY,
    run_id             uuid        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    key                text        NOT NULL,
    executor_kind      text        NOT NULL,
    action             text        NOT NULL,
    input              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    depends_on         text[]      NOT NULL DEFAULT '{}',
    -- Reverse edges, so a success unlocks dependents through the (run_id, key) index.
    dependents         text[]      NOT NULL DEFAULT '{}',
    unfinished_deps    integer     NOT NULL CHECK (unfinished_deps >= 0),
    state              text        NOT NULL
        CHECK (state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry',
                         'succeeded', 'failed', 'canceled', 'skipped')),
    attempts           integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts       integer     NOT NULL CHECK (max_attempts >= 1),
    backoff_initial_ms bigint      NOT NULL CHECK (backoff_initial_ms >= 0),
    backoff_max_ms     bigint      NOT NULL CHECK (backoff_max_ms >= backoff_initial_ms),
    backoff_multiplier double precision NOT NULL CHECK (backoff_multiplier >= 1),
    timeout_ms         bigint      NOT NULL CHECK (timeout_ms > 0),
    retry_at           timestamptz,
    output             jsonb,
    error              jsonb,
    ready_at           timestamptz,
    finished_at        timestamptz,
    UNIQUE (run_id, key),
    CHECK (attempts <= max_attempts),
    CHECK ((state = 'waiting_retry') = (retry_at IS NOT NULL)),
    CHECK (state <> 'pending' OR unfinished_deps > 0),
    CHECK ((state IN ('succeeded', 'failed', 'canceled', 'skipped')) = (finished_at IS NOT NULL))
);
CREATE INDEX tasks_ready ON tasks (run_id, id) WHERE state = 'ready';
CREATE INDEX tasks_retry_due ON tasks (retry_at) WHERE state = 'waiting_retry';
-- Finds a run's unfinished tasks without scanning its finished ones (run completion)
-- and counts its queued + running ones (run concurrency).
CREATE INDEX tasks_live ON tasks (run_id, state)
    WHERE state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry');

CREATE TABLE workers (
    id                 uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name               text        NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    protocol_version   integer     NOT NULL,
    executor_kinds     text[]      NOT NULL CHECK (cardinality(executor_kinds) >= 1),
    max_concurrency    integer     NOT NULL CHECK (max_concurrency BETWEEN 1 AND 1000),
    labels             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- SHA-256 of the session token; the token itself is never stored.
    session_token_hash bytea       NOT NULL CHECK (length(session_token_hash) = 32),
    state              text        NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'draining', 'stopped', 'offline')),
    registered_at      timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz,
    -- Bumped by each new heartbeat stream: only the newest stream's loss shortens leases.
    stream_epoch       bigint      NOT NULL DEFAULT 0,
    CHECK ((state IN ('stopped', 'offline')) = (stopped_at IS NOT NULL))
);
CREATE INDEX workers_live ON workers (last_heartbeat_at) WHERE state IN ('active', 'draining');

-- Strictly increasing across every lease ever issued: downstream stores compare it.
CREATE SEQUENCE fencing_tokens AS bigint;

CREATE TABLE dispatches (
    id               bigserial   PRIMARY KEY,
    run_id           uuid        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    task_id          bigint      NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    executor_kind    text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'leased', 'completed', 'expired', 'canceled')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    worker_id        uuid        REFERENCES workers (id),
    lease_token_hash bytea       CHECK (length(lease_token_hash) = 32),
    fencing_token    bigint      UNIQUE,
    leased_at        timestamptz,
    lease_expires_at timestamptz,
    attempt_deadline timestamptz,
    -- SHA-256 of the canonical accepted result: a repeat is DUPLICATE, a change CONFLICT.
    result_hash      bytea       CHECK (length(result_hash) = 32),
    finished_at      timestamptz,
    CHECK (state = 'pending' OR state = 'canceled' OR state = 'expired' OR worker_id IS NOT NULL),
    CHECK (state <> 'leased' OR (lease_token_hash IS NOT NULL AND lease_expires_at IS NOT NULL
                                 AND attempt_deadline IS NOT NULL AND fencing_token IS NOT NULL)),
    CHECK (lease_expires_at IS NULL OR lease_expires_at <= attempt_deadline),
    CHECK ((state = 'completed') = (result_hash IS NOT NULL)),
    CHECK ((state IN ('completed', 'expired', 'canceled')) = (finished_at IS NOT NULL))
);
-- At most one live dispatch per task: the database refuses a double dispatch.
CREATE UNIQUE INDEX dispatches_one_live_per_task ON dispatches (task_id) WHERE state IN ('pending', 'leased');
CREATE INDEX dispatches_run_created ON dispatches (run_id, created_at);
CREATE INDEX dispatches_pending_by_kind ON dispatches (executor_kind, id) WHERE state = 'pending';
CREATE INDEX dispatches_leased_by_expiry ON dispatches (lease_expires_at) WHERE state = 'leased';
CREATE INDEX dispatches_leased_by_deadline ON dispatches (attempt_deadline) WHERE state = 'leased';
CREATE INDEX dispatches_leased_by_worker ON dispatches (worker_id) WHERE state = 'leased';

CREATE TABLE attempts (
    id            bigserial   PRIMARY KEY,
    task_id       bigint      NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id        uuid        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    attempt       integer     NOT NULL CHECK (attempt >= 1),
    dispatch_id   bigint      NOT NULL UNIQUE REFERENCES dispatches (id) ON DELETE CASCADE,
    worker_id     uuid        NOT NULL REFERENCES workers (id),
    fencing_token bigint      NOT NULL UNIQUE,
    state         text        NOT NULL DEFAULT 'running'
        CHECK (state IN ('running', 'succeeded', 'failed', 'interrupted', 'timed_out', 'canceled')),
    started_at    timestamptz NOT NULL DEFAULT now(),
    deadline      timestamptz NOT NULL,
    finished_at   timestamptz,
    output        jsonb,
    error         jsonb,
    UNIQUE (task_id, attempt),
    CHECK ((state = 'running') = (finished_at IS NULL))
);
CREATE INDEX attempts_run ON attempts (run_id);
-- At most one running attempt per task.
CREATE UNIQUE INDEX attempts_one_running_per_task ON attempts (task_id) WHERE state = 'running';

CREATE TABLE state_events (
    run_id     uuid        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq        bigint      NOT NULL CHECK (seq >= 1),
    revision   bigint      NOT NULL CHECK (revision >= 1),
    type       text        NOT NULL,
    task_key   text,
    attempt    integer,
    from_state text,
    to_state   text,
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
