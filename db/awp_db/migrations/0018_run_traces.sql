-- OpenTelemetry traces (docs/observability.md): the run's place in a distributed trace.
-- StartRun stores the caller's W3C trace context (its traceparent header, from gRPC
-- metadata) or, when only the server traces, a new trace; every span about the run (its
-- tasks' queue waits, the attempts on the workers, a rescue by the reaper) is a child of
-- the run's span, whose ids are fixed here, so processes that never talk to each other
-- join one trace. All NULL: the run is not traced.
ALTER TABLE runs
    ADD COLUMN trace_id text CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    ADD COLUMN trace_span text CHECK (trace_span ~ '^[0-9a-f]{16}$'),
    ADD COLUMN trace_parent text CHECK (trace_parent ~ '^[0-9a-f]{16}$'),
    -- The run's span is exported once the run has finished (the coordinator's pass
    -- reads these through their partial index, and clears the flag as it exports).
    ADD COLUMN trace_pending boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT runs_trace_together CHECK ((trace_id IS NULL) = (trace_span IS NULL)),
    ADD CONSTRAINT runs_trace_parent_of_a_trace CHECK (trace_parent IS NULL OR trace_id IS NOT NULL),
    ADD CONSTRAINT runs_trace_pending_of_a_trace CHECK (NOT trace_pending OR trace_id IS NOT NULL);

CREATE INDEX runs_trace_pending ON runs (finished_at) WHERE trace_pending;

COMMENT ON COLUMN runs.trace_id IS 'The W3C trace id of the trace the run belongs to (32 lowercase hex digits): the caller''s, or a new one; NULL: not traced.';
COMMENT ON COLUMN runs.trace_span IS 'The span id of the run''s own span (16 hex digits): the parent of every span about the run.';
COMMENT ON COLUMN runs.trace_parent IS 'The caller''s span id, the parent of the run''s span; NULL: the run''s span is the root of its trace.';
COMMENT ON COLUMN runs.trace_pending IS 'The run''s span is still to be exported, once the run has finished (the coordinator).';
