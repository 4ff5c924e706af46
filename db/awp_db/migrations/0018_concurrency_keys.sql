-- Concurrency keys (docs/workflows.md "Concurrency keys", docs/design.md §16).
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
