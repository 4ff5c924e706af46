-- Each session's heartbeat interval, as its server told the worker at Register: the
-- coordinator judges silence in the session's own intervals, so the servers' setting is
-- never configured a second time. Sessions registered before this column existed were
-- given the servers' default then, 5 s.
ALTER TABLE workers
    ADD COLUMN heartbeat_interval_ms integer NOT NULL DEFAULT 5000
        CHECK (heartbeat_interval_ms > 0);

COMMENT ON COLUMN workers.heartbeat_interval_ms IS
    'The interval its server gave this session at Register; offline after 3 of them.';
