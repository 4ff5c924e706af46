-- name: append
-- Bumps each run's revision once and appends its events with contiguous seqs, in one
-- statement. $1..$2: one entry per run (ascending id, each run already locked by the
-- caller); $3..$10: one entry per event, `ord` 1..n within its run.
WITH counts AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS c (run_id, n)
), bumped AS (
    UPDATE runs r
       SET revision = r.revision + 1, last_seq = r.last_seq + c.n
      FROM counts c
     WHERE r.id = c.run_id
 RETURNING r.id, r.revision, r.last_seq - c.n AS base_seq
)
INSERT INTO state_events (run_id, seq, revision, type, task_key, attempt, from_state, to_state, payload)
SELECT e.run_id, b.base_seq + e.ord, b.revision, e.type, e.task_key, e.attempt,
       e.from_state, e.to_state, coalesce(e.payload::jsonb, '{}'::jsonb)
  FROM unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::int[], $8::text[], $9::text[], $10::text[])
           AS e (run_id, ord, type, task_key, attempt, from_state, to_state, payload)
  JOIN bumped b ON b.id = e.run_id

-- name: after_seq
SELECT run_id, seq, revision, type, task_key, attempt, from_state, to_state, payload, created_at
  FROM state_events
 WHERE run_id = $1 AND seq > $2
 ORDER BY seq
 LIMIT $3

-- name: notify_runs
-- Delivered at commit; the payload names the run so watchers re-read from their seq.
SELECT pg_notify($1, r::text) FROM unnest($2::uuid[]) AS r
