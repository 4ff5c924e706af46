-- Granting where the worker waits (docs/design.md §17): a Claim that finds no pending
-- dispatch for its free slots grants ready tasks itself, through the same rule as the
-- coordinator's pass (awp_db.grant). The one limit that lived only in the coordinator's
-- configuration, the global dispatch limit, is published here by the leader, so that
-- every grant keeps the same one.
ALTER TABLE coordinator_leader
    ADD COLUMN global_dispatch_limit integer NOT NULL DEFAULT 0 CHECK (global_dispatch_limit >= 0);

COMMENT ON COLUMN coordinator_leader.global_dispatch_limit IS
    'The leader''s --global-dispatch-limit (0: unbounded): pending + leased dispatches, kept by every grant, the coordinator''s and a Claim''s.';
