-- The grant's plain path (awp_db.grant, grant.sql: candidates): when no ready task carries
-- a priority, a concurrency key, a rate limit or a placement requirement and no running
-- run a priority, the round-robin alone orders the candidates, so only the first runs in
-- that order need reading, not every run with a ready task. These two indexes hold
-- exactly the rows that rule the plain path out, so each check is one probe of an index
-- that is empty in the common case.
CREATE INDEX tasks_ready_shaped ON tasks (id)
    WHERE state = 'ready'
      AND (priority <> 0 OR cardinality(concurrency_keys) > 0 OR cardinality(rate_names) > 0
           OR cardinality(required_labels) > 0 OR cardinality(resource_names) > 0);

CREATE INDEX runs_running_prioritised ON runs (id) WHERE state = 'running' AND priority <> 0;

-- The plain path walks the running runs in the round-robin's whole order, run id last:
-- the runs one StartRuns call starts share one created_at, and without the id the walk
-- sorted all of them to take the first few.
DROP INDEX runs_running;
CREATE INDEX runs_running ON runs (last_dispatched_at NULLS FIRST, created_at, id)
    WHERE state = 'running';

COMMENT ON INDEX tasks_ready_shaped IS
    'Ready tasks the grant cannot order by the round-robin alone (a priority, a concurrency key, a rate limit, a placement requirement): while none exists the grant reads only the first runs in turn (grant.sql: candidates).';
COMMENT ON INDEX runs_running_prioritised IS
    'Running runs with a priority: while none exists (and tasks_ready_shaped is empty) the grant reads only the first runs in turn (grant.sql: candidates).';
