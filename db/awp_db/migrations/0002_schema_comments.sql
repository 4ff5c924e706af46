-- The schema documents itself: why each table, and each column, index or constraint
-- that is not obvious, exists. `make schema` writes them into db/awp_db/schema.sql,
-- and operators see them in psql (\d+).

COMMENT ON TABLE workflows IS
    'Immutable, versioned workflow definitions: a changed definition is a new version.';
COMMENT ON COLUMN workflows.definition_hash IS
    'SHA-256 of the canonical definition: an identical re-create is idempotent, a different one a conflict.';

COMMENT ON TABLE runs IS
    'One execution of a workflow version. Its row lock serialises every change to the run, its tasks and its events (lock order: awp_db/locks.py).';
COMMENT ON COLUMN runs.revision IS
    'Bumped once per transaction that changed the run: watchers and clients compare it.';
COMMENT ON COLUMN runs.last_seq IS
    'The seq of the run''s newest state_events row: a watcher knows whether it has seen everything.';
COMMENT ON COLUMN runs.concurrency IS
    'At most this many of the run''s tasks queued or running at once; 0: unbounded.';
COMMENT ON COLUMN runs.request_id IS
    'The client''s idempotency key: StartRun with a used key returns that run.';
COMMENT ON COLUMN runs.cancel_requested_at IS
    'Cancellation intent, persisted first; the coordinator converges the run afterwards.';
COMMENT ON COLUMN runs.last_dispatched_at IS
    'Fairness lives here so that it survives coordinator restarts: runs never dispatched (NULL) first, then least-recently dispatched.';
COMMENT ON INDEX runs_cancel_pending IS
    'The coordinator''s cancel candidates without a scan of every run.';
COMMENT ON INDEX runs_created IS
    'ListRuns pages newest first on (created_at, id).';

COMMENT ON TABLE tasks IS
    'The tasks of a run, all created with the run; a task''s state moves only under its run''s lock.';
COMMENT ON COLUMN tasks.dependents IS
    'Reverse edges, so a success unlocks its dependents through the (run_id, key) index.';
COMMENT ON COLUMN tasks.unfinished_deps IS
    'Dependencies not yet succeeded: the task becomes ready when this reaches 0.';
COMMENT ON COLUMN tasks.retry_at IS
    'When a task waiting for a retry becomes ready again (set exactly while waiting_retry).';
COMMENT ON INDEX tasks_ready IS
    'Dispatch reads each run''s ready tasks in id order from here.';
COMMENT ON INDEX tasks_retry_due IS
    'The coordinator''s retry timers, earliest first.';
COMMENT ON INDEX tasks_live IS
    'Finds a run''s unfinished tasks without scanning its finished ones (run completion) and counts its queued + running ones (run concurrency).';

COMMENT ON TABLE workers IS
    'Worker sessions: one row per Register. A session''s row lock serialises its claims, its drain and the loss of its heartbeat stream.';
COMMENT ON COLUMN workers.session_token_hash IS
    'SHA-256 of the session token; the token itself is never stored.';
COMMENT ON COLUMN workers.stream_epoch IS
    'Bumped by each new heartbeat stream: only the newest stream''s loss shortens leases.';
COMMENT ON INDEX workers_live IS
    'The coordinator finds silent live sessions by their last heartbeat.';

COMMENT ON SEQUENCE fencing_tokens IS
    'Strictly increasing across every lease ever issued: downstream stores compare it.';

COMMENT ON TABLE dispatches IS
    'Offers of a task to the workers of its executor kind; leased, a dispatch is a lease with its token digest, expiry and attempt deadline.';
COMMENT ON COLUMN dispatches.lease_token_hash IS
    'SHA-256 of the lease token; the token itself is never stored.';
COMMENT ON COLUMN dispatches.result_hash IS
    'SHA-256 of the canonical accepted result: a repeat is DUPLICATE, a change RESULT_CONFLICT.';
COMMENT ON INDEX dispatches_one_live_per_task IS
    'At most one live dispatch per task: the database refuses a double dispatch.';
COMMENT ON INDEX dispatches_pending_by_kind IS
    'Claims and dispatch read the few pending dispatches of a kind, oldest first, from here.';
COMMENT ON INDEX dispatches_leased_by_expiry IS
    'The reaper''s expired leases, earliest first.';
COMMENT ON INDEX dispatches_leased_by_deadline IS
    'The reaper''s passed attempt deadlines, earliest first.';
COMMENT ON INDEX dispatches_leased_by_worker IS
    'A worker''s leases: free slots at claim, hand-back at drain, settlement when it goes offline.';

COMMENT ON TABLE attempts IS
    'One row per lease issued: who ran the task, with which fencing token, and how it ended.';
COMMENT ON INDEX attempts_one_running_per_task IS
    'At most one running attempt per task.';

COMMENT ON TABLE state_events IS
    'Each run''s event log, seqs contiguous from 1 (written under the run''s lock); WatchRun replays it.';
