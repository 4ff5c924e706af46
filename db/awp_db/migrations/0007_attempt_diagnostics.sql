-- What a failed attempt keeps for whoever debugs it (DESIGN.md §13, TaskError in
-- protos/awp/v1/types.proto): beside its error {message, retryable, type} in `error`,
-- the traceback and the action's last log lines, each bounded by the protocol
-- (awp_protocol.limits). Kept on the attempt only: task rows and events stay small.
ALTER TABLE attempts
    ADD COLUMN traceback text CHECK (length(traceback) <= 16384),
    ADD COLUMN log_tail text CHECK (length(log_tail) <= 8192),
    ADD CONSTRAINT attempts_diagnostics_of_failures
        CHECK (state = 'failed' OR (traceback IS NULL AND log_tail IS NULL));

COMMENT ON COLUMN attempts.traceback IS
    'The failed action''s traceback as its worker reported it, innermost frames last (at most 16,384 characters, cut from the outside in).';
COMMENT ON COLUMN attempts.log_tail IS
    'The last lines the failed action logged or printed, oldest first (at most 50 lines, 8,192 characters).';
