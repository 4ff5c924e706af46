-- tasks_live (0001) holds a run's unfinished tasks, but it was written before the
-- WAITING state (0015): every query for a run's live tasks names all six live states,
-- which the index's predicate does not imply, so PostgreSQL could not use it and walked
-- every task the run ever had instead (EXPLAIN ANALYZE: a settlement's "is any task of
-- this run still live" read 1,236 index entries and 284 heap pages of a run of 1,000
-- tasks, 0.7 ms a run; a Complete of 8 results across 8 runs spent 6 of its 7 ms there).
-- Rebuilt with WAITING, it serves them again.
DROP INDEX tasks_live;
CREATE INDEX tasks_live ON tasks (run_id, state)
    WHERE state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting');

COMMENT ON INDEX tasks_live IS
    'Finds a run''s unfinished tasks (every live state, waiting included) without scanning its finished ones (run completion) and counts its queued + running ones (run concurrency).';
