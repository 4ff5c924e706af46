-- Who started and who canceled each run: the name of the credential the call presented
-- (the audit trail of docs/security.md; 'anonymous' on a server without credentials).
ALTER TABLE runs
    ADD COLUMN started_by text,
    ADD COLUMN cancel_requested_by text;

COMMENT ON COLUMN runs.started_by IS
    'Credential name of the StartRun caller (NULL for runs started before it was recorded).';
COMMENT ON COLUMN runs.cancel_requested_by IS
    'Credential name of the CancelRun caller whose request was recorded.';
