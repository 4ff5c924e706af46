-- Dynamic work (docs/workflows.md): map tasks and their elements, the tasks downstream of
-- a failure that lets the run continue, and always tasks. Every statement runs inside a
-- settlement, with the runs it touches already locked (locks.sql states the lock order);
-- task rows are only written under their run's lock.
--
-- The statements that end a task return what its end sets off, as the columns of
-- awp_db.dynamic.Finished.

-- name: map_sources
-- Map tasks that have just started ($1): the JSON type of the value at each one's path
-- in its upstream's output, its length when it is a list, and the largest input of an
-- element (as expand_maps makes it, in JSON text: what a Claim measures). Only these
-- figures leave the database; the list itself is expanded by expand_maps.
SELECT m.id, m.run_id, m.key, m.map_over, array_to_string(m.map_path, '.') AS path,
       jsonb_typeof(u.output #> m.map_path) AS type,
       CASE WHEN jsonb_typeof(u.output #> m.map_path) = 'array'
            THEN jsonb_array_length(u.output #> m.map_path) END AS size,
       CASE WHEN jsonb_typeof(u.output #> m.map_path) = 'array'
            THEN (SELECT max(octet_length(
                             (m.input || jsonb_build_object('item', e.value, 'index', e.ord - 1))::text))
                    FROM jsonb_array_elements(u.output #> m.map_path) WITH ORDINALITY AS e (value, ord))
       END AS largest_input
  FROM tasks m
  JOIN tasks u ON u.run_id = m.run_id AND u.key = m.map_over
 WHERE m.id = ANY($1::bigint[])
 ORDER BY m.id

-- name: expand_maps
-- Creates the elements of the map tasks $1, READY: $1/$2/$3 name each element (its map
-- task, key and index, in index order). Each one is the map task with the element added
-- to its input ("item", "index") and no dependents: its end is counted by its map task.
WITH named AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[]) AS n (parent_id, key, map_index)
), started AS (
    UPDATE tasks m
       SET map_size = c.n, elements_left = c.n
      FROM (SELECT parent_id, count(*) AS n FROM named GROUP BY parent_id) c
     WHERE m.id = c.parent_id AND m.state = 'running' AND m.map_size IS NULL
 RETURNING m.id
)
INSERT INTO tasks (run_id, key, executor_kind, action, input, depends_on, dependents,
                   unfinished_deps, state, max_attempts, backoff_initial_ms, backoff_max_ms,
                   backoff_multiplier, timeout_ms, ready_at, parent_id, map_index,
                   concurrency_keys, concurrency_max, rate_names, rate_units, priority,
                   required_labels, preferred_labels, resource_names, resource_units, sticky)
-- Each element holds its map task's concurrency keys, rate uses (rendered from the run
-- input), priority and placement.
SELECT m.run_id, n.key, m.executor_kind, m.action,
       m.input || jsonb_build_object('item', e.value, 'index', n.map_index),
       m.depends_on, '{}', 0, 'ready', m.max_attempts, m.backoff_initial_ms, m.backoff_max_ms,
       m.backoff_multiplier, m.timeout_ms, clock_timestamp(), m.id, n.map_index,
       m.concurrency_keys, m.concurrency_max, m.rate_names, m.rate_units, m.priority,
       m.required_labels, m.preferred_labels, m.resource_names, m.resource_units, m.sticky
  FROM started s
  JOIN tasks m ON m.id = s.id
  JOIN tasks u ON u.run_id = m.run_id AND u.key = m.map_over
  CROSS JOIN LATERAL jsonb_array_elements(u.output #> m.map_path) WITH ORDINALITY AS e (value, ord)
  JOIN named n ON n.parent_id = m.id AND n.map_index = e.ord - 1
 ORDER BY n.parent_id, n.map_index
RETURNING run_id, key

-- name: succeed_maps
-- Map tasks $1 (running) whose every element succeeded, or that have none: each succeeds
-- with {"outputs": [its elements' outputs in index order]}, unless that would be more
-- than $2 bytes of JSON text (limits.MAX_OUTPUT_BYTES); then nothing is written for it.
-- Every one is returned, `bytes` telling which.
WITH combined AS (
    SELECT m.id,
           jsonb_build_object(
               'outputs',
               coalesce((SELECT jsonb_agg(e.output ORDER BY e.map_index)
                           FROM tasks e WHERE e.parent_id = m.id), '[]'::jsonb)) AS output
      FROM tasks m
     WHERE m.id = ANY($1::bigint[]) AND m.state = 'running'
), measured AS (
    SELECT id, output, octet_length(output::text) AS bytes FROM combined
), succeeded AS (
    UPDATE tasks m
       SET state = 'succeeded', output = c.output, finished_at = clock_timestamp(),
           map_size = coalesce(m.map_size, 0), elements_left = 0
      FROM measured c
     WHERE m.id = c.id AND c.bytes <= $2
 RETURNING m.id, m.run_id, m.key, m.state, m.dependents, m.parent_id, m.map_index,
           m.on_failure, m.always, m.error
)
SELECT c.id, c.bytes, s.id IS NOT NULL AS succeeded,
       s.run_id, s.key, s.state, s.dependents, s.parent_id, s.map_index, s.on_failure, s.always,
       s.error
  FROM measured c LEFT JOIN succeeded s ON s.id = c.id
 ORDER BY c.id

-- name: fail_tasks
-- Running tasks $1 fail for good with the errors $2 (JSON): map tasks, which have no
-- attempt to end.
UPDATE tasks t
   SET state = 'failed', error = f.error::jsonb, finished_at = clock_timestamp()
  FROM unnest($1::bigint[], $2::text[]) AS f (id, error)
 WHERE t.id = f.id AND t.state = 'running'
RETURNING t.id, t.run_id, t.key, t.state, t.dependents, t.parent_id, t.map_index,
          t.on_failure, t.always, t.error

-- name: count_down
-- One entry in $1 per element that succeeded: its map task counts it. Returns the map
-- tasks (still running) with no element left.
WITH done AS (
    SELECT id, count(*) AS n FROM unnest($1::bigint[]) AS d (id) GROUP BY id
)
UPDATE tasks m
   SET elements_left = m.elements_left - done.n
  FROM done
 WHERE m.id = done.id AND m.state = 'running'
RETURNING m.id, m.elements_left

-- name: cancel_element_dispatches
-- The live dispatches of the elements of the map tasks $1 (a map task failed), locked in
-- id order as heartbeats lock leased ones (awp_db.locks).
WITH live AS (
    SELECT d.id
      FROM dispatches d JOIN tasks t ON d.task_id = t.id
     WHERE t.parent_id = ANY($1::bigint[]) AND d.state IN ('pending', 'leased')
     ORDER BY d.id
       FOR NO KEY UPDATE OF d
)
UPDATE dispatches d
   SET state = 'canceled', finished_at = clock_timestamp()
  FROM live
 WHERE d.id = live.id

-- name: cancel_element_attempts
UPDATE attempts a
   SET state = 'canceled', finished_at = clock_timestamp()
  FROM tasks t
 WHERE t.parent_id = ANY($1::bigint[]) AND a.task_id = t.id AND a.state = 'running'
RETURNING a.run_id, t.key, a.attempt

-- name: stop_elements
-- The unfinished elements of the map tasks $1: a running one is canceled (its attempt
-- was stopped), the others will never run.
UPDATE tasks t
   SET state = CASE WHEN t.state = 'running' THEN 'canceled' ELSE 'skipped' END,
       retry_at = NULL, finished_at = clock_timestamp()
  FROM (SELECT id, state FROM tasks
         WHERE parent_id = ANY($1::bigint[])
           AND state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting')) live
 WHERE t.id = live.id
RETURNING t.run_id, t.key, live.state AS from_state, t.state AS to_state

-- name: skip_downstream
-- Every task downstream of the tasks $1 (which failed for good, letting the run
-- continue), through the dependents edges: each is still pending (it waits for a task
-- that will never succeed) and never will run. Always tasks are never among dependents.
WITH RECURSIVE down (run_id, key) AS (
    SELECT f.run_id, d.key
      FROM tasks f CROSS JOIN LATERAL unnest(f.dependents) AS d (key)
     WHERE f.id = ANY($1::bigint[])
    UNION
    SELECT t.run_id, d.key
      FROM down
      JOIN tasks t ON t.run_id = down.run_id AND t.key = down.key
      CROSS JOIN LATERAL unnest(t.dependents) AS d (key)
)
UPDATE tasks t
   SET state = 'skipped', finished_at = clock_timestamp()
  FROM down
 WHERE t.run_id = down.run_id AND t.key = down.key AND t.state = 'pending'
RETURNING t.run_id, t.key

-- name: release_always
-- The always tasks of the runs $1 that may start: every task but the always ones is
-- terminal, and so is every always task it depends on.
UPDATE tasks t
   SET state = 'ready', unfinished_deps = 0, ready_at = clock_timestamp()
 WHERE t.run_id = ANY($1::uuid[]) AND t.always AND t.state = 'pending'
   AND NOT EXISTS (
       SELECT 1 FROM tasks l
        WHERE l.run_id = t.run_id
          AND l.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry', 'waiting')
          AND (NOT l.always OR l.key = ANY(t.depends_on)))
RETURNING t.run_id, t.key
