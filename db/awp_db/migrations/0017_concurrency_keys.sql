-- Concurrency keys (docs/workflows.md "Concurrency keys", docs/design.md §17).
--
-- A task's keyed limits are rendered from its run's input when the task is created
-- (awp_kernel.concurrency): concurrency_keys[i] may be held by at most
-- concurrency_max[i] live leases. The grant (awp_db.grant, under the dispatch lock)
-- copies them onto the dispatch it creates, so a unit is held exactly while that
-- dispatch is live (pending or leased) and is given back by whatever ends it: Complete,
-- revoke, expiry, hand-back, a withdrawn offer. Nothing counts units apart from the live
-- dispatches themselves, so there is nothing to leak.
ALTER TABLE tasks
    ADD COLUMN concurrency_keys text[] NOT NULL DEFAULT '{}',
    ADD COLUMN concurrency_max integer[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT tasks_concurrency_aligned
        CHECK (cardinality(concurrency_keys) = cardinality(concurrency_max));
ALTER TABLE dispatches
    ADD COLUMN concurrency_keys text[] NOT NULL DEFAULT '{}',
    ADD COLUMN concurrency_max integer[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT dispatches_concurrency_aligned
        CHECK (cardinality(concurrency_keys) = cardinality(concurrency_max));
-- The units held now: the live dispatches that hold a key.
CREATE INDEX dispatches_live_keyed ON dispatches (id)
    WHERE state IN ('pending', 'leased') AND cardinality(concurrency_keys) > 0;
COMMENT ON COLUMN tasks.concurrency_keys IS
    'Keys rendered from the run input at creation; each of its leases holds one unit of each.';
COMMENT ON COLUMN dispatches.concurrency_keys IS
    'The keys this dispatch holds a unit of while pending or leased (awp_db.grant).';

-- Rate limits and token budgets (docs/workflows.md "Rate limits and token budgets"):
-- named limits of `units` per `period_ms`, set at run time (SetRateLimit). A task
-- declares what it uses of each (rendered from the run input when the task is created,
-- rate_names[i] / rate_units[i]); each grant charges that estimate in rate_charges, and
-- the usage the attempt reports in its fenced Complete replaces it (actual). A limit
-- paused by a "slow down" report grants nothing until paused_until.
CREATE TABLE rate_limits (
    name         text        PRIMARY KEY,
    units        bigint      NOT NULL CHECK (units >= 0),
    period_ms    bigint      NOT NULL CHECK (period_ms > 0),
    paused_until timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text        NOT NULL
);
ALTER TABLE tasks
    ADD COLUMN rate_names text[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_units bigint[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT tasks_rate_aligned CHECK (cardinality(rate_names) = cardinality(rate_units));
-- One row per (grant, limit): the estimate charged at grant, the budget in force then,
-- and the actual usage once reported. A window's use is the sum over the charges granted
-- in it of coalesce(actual, estimate).
CREATE TABLE rate_charges (
    dispatch_id  bigint      NOT NULL REFERENCES dispatches (id) ON DELETE CASCADE,
    limit_name   text        NOT NULL,
    granted_at   timestamptz NOT NULL,
    estimate     bigint      NOT NULL CHECK (estimate >= 0),
    actual       bigint      CHECK (actual >= 0),
    reported_at  timestamptz,
    budget_units bigint      NOT NULL,
    period_ms    bigint      NOT NULL,
    PRIMARY KEY (dispatch_id, limit_name),
    CHECK ((actual IS NULL) = (reported_at IS NULL))
);
CREATE INDEX rate_charges_window ON rate_charges (limit_name, granted_at);
COMMENT ON TABLE rate_limits IS
    'Named limits of units per period, set at run time; a slow-down report pauses one.';
COMMENT ON TABLE rate_charges IS
    'What each grant charged a rate limit: the estimate, replaced by the reported actual.';
