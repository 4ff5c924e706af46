-- A lease that stops being valid for any reason but its holder's own result (a run or
-- element canceled, a reaped lease, an offline session's leases, a hand-back) tells the
-- servers at once, so the one holding the holder's heartbeat stream can answer REVOKED
-- without waiting for the worker's next heartbeat (docs/design.md, "Cancellation
-- latency"). One trigger, rather than a NOTIFY beside every statement that ends a lease,
-- so that no path can forget it. The payload is '<worker uuid>:<dispatch id>' (parsed
-- by awp_db.revocations); PostgreSQL folds repeats within a transaction. Receivers read
-- the dispatch again before they answer: the payload says only where to look.
-- 'completed' is left out: only the holder's own accepted result completes a lease.
CREATE FUNCTION notify_lease_revoked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('awp_lease_revoked', OLD.worker_id::text || ':' || OLD.id::text);
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION notify_lease_revoked() IS
    'NOTIFY awp_lease_revoked with ''<worker uuid>:<dispatch id>'' (awp_db.signals.LEASE_REVOKED_CHANNEL).';

CREATE TRIGGER dispatches_lease_revoked
    AFTER UPDATE OF state ON dispatches
    FOR EACH ROW
    WHEN (OLD.state = 'leased' AND NEW.state IN ('canceled', 'expired'))
    EXECUTE FUNCTION notify_lease_revoked();

COMMENT ON TRIGGER dispatches_lease_revoked ON dispatches IS
    'A lease ended by anyone but its holder''s result: the server holding the holder''s heartbeat stream answers REVOKED at once.';
