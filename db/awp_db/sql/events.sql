-- name: append
-- Bumps each run's revision once, appends its events with contiguous seqs and sends
-- the notifications, in one statement (one round trip per transaction). :run_ids and
-- :counts: one entry per run (ascending id, each run already locked by the caller);
-- :event_run_ids to :payloads: one entry per event, `ord` 1..n within its run;
-- :run_events_channel: the run-events channel (payload: the run id); :channels and
-- :channel_payloads: further notifications (channel, payload). A data-modifying
-- WITH always runs to completion; NOTIFY is delivered at commit.
WITH counts AS (
    SELECT * FROM unnest(:run_ids::uuid[], :counts::bigint[]) AS c (run_id, n)
), bumped AS (
    UPDATE runs r
       SET revision = r.revision + 1, last_seq = r.last_seq + c.n
      FROM counts c
     WHERE r.id = c.run_id
 RETURNING r.id, r.revision, r.last_seq - c.n AS base_seq
), appended AS (
    INSERT INTO state_events (run_id, seq, revision, type, task_key, attempt, from_state, to_state, payload)
    SELECT e.run_id, b.base_seq + e.ord, b.revision, e.type, e.task_key, e.attempt,
           e.from_state, e.to_state, coalesce(e.payload::jsonb, '{}'::jsonb)
      FROM unnest(:event_run_ids::uuid[], :ords::bigint[], :types::text[], :task_keys::text[],
                  :attempts::int[], :from_states::text[], :to_states::text[], :payloads::text[])
               AS e (run_id, ord, type, task_key, attempt, from_state, to_state, payload)
      JOIN bumped b ON b.id = e.run_id
)
SELECT pg_notify(n.channel, n.payload)
  FROM (SELECT :run_events_channel::text, r::text FROM unnest(:run_ids::uuid[]) AS r
        UNION ALL
        SELECT * FROM unnest(:channels::text[], :channel_payloads::text[])) AS n (channel, payload)

-- name: after_seq
SELECT run_id, seq, revision, type, task_key, attempt, from_state, to_state, payload, created_at
  FROM state_events
 WHERE run_id = $1 AND seq > $2
 ORDER BY seq
 LIMIT $3

-- name: notify
-- Notifications of a transaction that recorded no event.
SELECT pg_notify(n.channel, n.payload) FROM unnest($1::text[], $2::text[]) AS n (channel, payload)
