-- Offline detection never blames a worker for the platform's outage (DESIGN.md §7):
-- a worker's silence counts only while some awp-server could have recorded its
-- heartbeat. Each server records here that it is serving; heartbeat_silence_from() turns
-- the rows into the moment from which silence counts.
CREATE TABLE servers (
    id uuid PRIMARY KEY,
    serving_since timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    stale_after_ms integer NOT NULL CHECK (stale_after_ms > 0),
    CHECK (serving_since <= last_seen_at)
);

COMMENT ON TABLE servers IS
    'One row per awp-server process: the stretch of time it has been serving without a gap (awp_db.workers.record_liveness).';
COMMENT ON COLUMN servers.serving_since IS
    'Start of the current unbroken stretch: reset to the write''s time when a write finds the previous one stale (the server or the database was away).';
COMMENT ON COLUMN servers.stale_after_ms IS
    'The server is live until last_seen_at plus this (two of its liveness intervals).';

-- The moment from which a live session's silence counts now: the start of the current
-- unbroken stretch during which at least one server was live (the union of the servers'
-- [serving_since, last_seen_at + stale_after_ms] spans that reaches the present). Now
-- itself when no server is live: nothing can record a heartbeat, so no silence counts.
-- '-infinity' when no server has ever recorded liveness (servers older than this rule,
-- or storage used without a server): silence then counts from the last heartbeat alone.
-- PL/pgSQL rather than SQL: its body is checked when first run, not when created, so
-- schema.sql (which pg_dump orders functions before tables) loads as it is.
CREATE FUNCTION heartbeat_silence_from() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (
        WITH clock AS (SELECT clock_timestamp() AS now),
             spans AS (
                 SELECT serving_since AS since,
                        last_seen_at + stale_after_ms * interval '1 millisecond' AS until
                   FROM servers),
             stretches AS (
                 -- A span starts a stretch when it begins after every earlier span ended.
                 SELECT since,
                        since > max(until) OVER (ORDER BY since
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                            AS after_a_gap
                   FROM spans)
        SELECT CASE
                   WHEN NOT EXISTS (SELECT 1 FROM spans) THEN '-infinity'::timestamptz
                   WHEN NOT EXISTS (SELECT 1 FROM spans, clock WHERE until > clock.now)
                       THEN (SELECT now FROM clock)
                   -- A live span reaches the present, so it lies in the newest stretch.
                   ELSE (SELECT max(since) FROM stretches WHERE after_a_gap IS NOT FALSE)
               END);
END
$$;

COMMENT ON FUNCTION heartbeat_silence_from() IS
    'When a live session''s silence starts counting: the start of the current unbroken stretch with a live server (offline rule, DESIGN.md §7).';
