-- Checkpoints of tasks (docs/design.md §16): step memos and satisfied waits. A stored
-- checkpoint never changes; it is written under its attempt's lease (locks.sql
-- lease_for_memo) or, for a wait's outcome, under its run's lock.

-- name: task_of_lease
-- The task of dispatch $1 (LoadCheckpoints: the lease was judged live just before).
SELECT task_id FROM dispatches WHERE id = $1

-- name: page
-- Task $1's checkpoints after (kind, name, occurrence) ($2, $3, $4) (NULL $2: from the
-- first), in that order, as many as add up to $5 bytes of value (the first always);
-- `available`: how many there are after that key (more than returned: another page).
WITH after AS (
    SELECT c.kind, c.name, c.occurrence, c.value, c.value_bytes, c.tokens, c.cost_usd,
           c.timed_out, c.attempt
      FROM checkpoints c
     WHERE c.task_id = $1
       AND ($2::text IS NULL OR (c.kind, c.name, c.occurrence) > ($2, $3::text, $4::int))
), sized AS (
    SELECT after.*,
           sum(value_bytes) OVER (ORDER BY kind, name, occurrence) AS through,
           row_number() OVER (ORDER BY kind, name, occurrence) AS ord,
           count(*) OVER () AS available
      FROM after
)
SELECT kind, name, occurrence, value::text AS value_json, tokens, cost_usd, timed_out,
       coalesce(attempt, 0) AS attempt, available::int
  FROM sized WHERE through <= $5 OR ord = 1
 ORDER BY kind, name, occurrence

-- name: stored
-- The checkpoint stored under a key, if any, and whether its value is $5.
SELECT value = $5::text::jsonb AS same FROM checkpoints
 WHERE task_id = $1 AND kind = $2 AND name = $3 AND occurrence = $4

-- name: totals
-- What task $1 stores: checkpoints and bytes of value.
SELECT count(*)::int AS memos, coalesce(sum(value_bytes), 0)::bigint AS bytes
  FROM checkpoints WHERE task_id = $1

-- name: insert_step
INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value, value_bytes,
                         tokens, cost_usd, dispatch_id, attempt, fencing_token)
VALUES (:task_id, :run_id, 'step', :name, :occurrence, :value::text::jsonb, :value_bytes,
        :tokens, :cost_usd, :dispatch_id, :attempt, :fencing_token)

-- name: insert_wait_outcome
-- A satisfied (or timed-out) wait's outcome: by the attempt that reached it (its
-- dispatch, attempt and fencing token) or, when no attempt ran, NULL for all three.
INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value, value_bytes,
                         timed_out, dispatch_id, attempt, fencing_token)
VALUES (:task_id, :run_id, :kind, :name, :occurrence, :value::text::jsonb,
        octet_length(:value::text), :timed_out, :dispatch_id, :attempt,
        (SELECT fencing_token FROM attempts WHERE dispatch_id = :dispatch_id))
RETURNING kind, name, occurrence, value::text AS value_json, tokens, cost_usd, timed_out,
          coalesce(attempt, 0) AS attempt, 1 AS available
