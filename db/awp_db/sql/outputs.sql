-- Outputs too large to travel inside a lease or a GetRun answer, fetched on their own
-- (DESIGN.md §4 "Sizes"). Unlocked reads: an output never changes once accepted.

-- name: outputs
-- The outputs of run $1's tasks $2, in that order, as many as add up to $3 bytes of JSON
-- text (the first always).
WITH asked AS (
    SELECT a.key, a.ord FROM unnest($2::text[]) WITH ORDINALITY AS a (key, ord)
), sized AS (
    SELECT a.key, a.ord, t.output,
           octet_length(coalesce(t.output, '{}'::jsonb)::text) AS own,
           sum(octet_length(coalesce(t.output, '{}'::jsonb)::text)) OVER (ORDER BY a.ord) AS through
      FROM asked a JOIN tasks t ON t.run_id = $1 AND t.key = a.key
)
SELECT key, output FROM sized WHERE through <= $3 OR through = own ORDER BY ord

-- name: task_output
SELECT output FROM tasks WHERE run_id = $1 AND key = $2
