-- An output is stored once, on its task (docs/performance.md, round 3). It was written
-- on the succeeded attempt too, by the same statement, so every output was stored,
-- TOASTed and WAL-logged twice (114 MB of WAL per 1,000 tasks of 100 KB outputs, 2.3x
-- the outputs). Only one attempt of a task can succeed (its dispatch keeps the accepted
-- result's hash), so the copy said nothing the task's does not.
ALTER TABLE attempts DROP COLUMN output;
