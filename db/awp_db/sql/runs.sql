-- name: insert
-- Returns nothing when request_id was already used (the caller fetches that run).
-- $6/$7: the schedule and tick that started it (NULL: none). A delayed start: at $8, or
-- $9 ms from now on the database clock (both NULL: at once); awaiting_start says whether
-- that time is still ahead, so the roots wait (the coordinator releases them).
-- $10-$12: its trace id, its own span id and its caller's (all NULL: not traced).
-- $13: its priority.
INSERT INTO runs (workflow_id, input, concurrency, request_id, started_by, schedule_id,
                  schedule_tick, start_at, awaiting_start, trace_id, trace_span,
                  trace_parent, trace_pending, priority)
SELECT $1, $2, $3, $4, $5, $6, $7, s.at, coalesce(s.at > clock_timestamp(), false),
       $10, $11, $12, $10::text IS NOT NULL, $13
  FROM (SELECT coalesce($8::timestamptz,
                        clock_timestamp() + $9::bigint * interval '1 millisecond') AS at) s
ON CONFLICT (request_id) DO NOTHING
RETURNING id, awaiting_start

-- name: insert_tasks
-- :map_over/:map_paths: a map task's upstream and path (JSON array of keys), NULL for
-- other tasks. :delayed: the run's start is delayed: its roots are pending too, waiting
-- for one more thing, the start time (coordination.sql: release_starts).
-- :concurrency_keys/:concurrency_max: JSON arrays, the keys rendered from the run input
-- (awp_kernel.concurrency) and each one's max; :rate_names/:rate_units: JSON arrays, the
-- rate limits each execution charges and the units (awp_kernel.ratelimits).
-- :placements: each task's placement as JSON (awp_kernel.placement.Placement.to_json).
-- The tasks of several runs at once (StartRuns): :run_ids and :delayed per task.
INSERT INTO tasks (run_id, key, executor_kind, action, input, depends_on, dependents,
                   unfinished_deps, state, max_attempts, backoff_initial_ms, backoff_max_ms,
                   backoff_multiplier, timeout_ms, ready_at, map_over, map_path, on_failure,
                   always, concurrency_keys, concurrency_max, rate_names, rate_units,
                   wait_task, priority, required_labels, preferred_labels, resource_names,
                   resource_units, sticky)
SELECT t.run_id, t.key, t.executor_kind, t.action, t.input::jsonb,
       coalesce(array(SELECT jsonb_array_elements_text(t.depends_on::jsonb)), '{}'),
       coalesce(array(SELECT jsonb_array_elements_text(t.dependents::jsonb)), '{}'),
       t.unfinished_deps + CASE WHEN t.unfinished_deps = 0 AND t.delayed THEN 1 ELSE 0 END,
       CASE WHEN t.unfinished_deps = 0 AND NOT t.delayed THEN 'ready' ELSE 'pending' END,
       t.max_attempts, t.backoff_initial_ms, t.backoff_max_ms, t.backoff_multiplier, t.timeout_ms,
       CASE WHEN t.unfinished_deps = 0 AND NOT t.delayed THEN now() END,
       t.map_over,
       CASE WHEN t.map_over IS NOT NULL
            THEN array(SELECT jsonb_array_elements_text(t.map_path::jsonb)) END,
       t.on_failure, t.always,
       array(SELECT jsonb_array_elements_text(t.concurrency_keys::jsonb)),
       array(SELECT jsonb_array_elements_text(t.concurrency_max::jsonb)::int),
       array(SELECT jsonb_array_elements_text(t.rate_names::jsonb)),
       array(SELECT jsonb_array_elements_text(t.rate_units::jsonb)::bigint),
       t.wait_task::jsonb, t.priority,
       array(SELECT jsonb_array_elements_text(t.placement::jsonb -> 'required_labels')),
       array(SELECT jsonb_array_elements_text(t.placement::jsonb -> 'preferred_labels')),
       array(SELECT r.key FROM jsonb_each(t.placement::jsonb -> 'resources') r ORDER BY r.key),
       array(SELECT r.value::bigint FROM jsonb_each(t.placement::jsonb -> 'resources') r
              ORDER BY r.key),
       coalesce((t.placement::jsonb ->> 'sticky')::bool, false)
  FROM unnest(:run_ids::uuid[], :delayed::bool[], :keys::text[], :executor_kinds::text[], :actions::text[], :inputs::text[],
              :depends_on::text[], :dependents::text[], :unfinished_deps::int[],
              :max_attempts::int[], :backoff_initial_ms::bigint[], :backoff_max_ms::bigint[],
              :backoff_multipliers::float8[], :timeout_ms::bigint[], :map_over::text[],
              :map_paths::text[], :on_failure::text[], :always::bool[],
              :concurrency_keys::text[], :concurrency_max::text[], :rate_names::text[],
              :rate_units::text[], :wait_tasks::text[], :priorities::int[], :placements::text[])
       AS t (run_id, delayed, key, executor_kind, action, input, depends_on, dependents,
             unfinished_deps,
             max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier, timeout_ms,
             map_over, map_path, on_failure, always, concurrency_keys, concurrency_max,
             rate_names, rate_units, wait_task, priority, placement)
RETURNING run_id, key, state

-- name: by_request_id
SELECT id FROM runs WHERE request_id = $1

-- name: insert_many
-- StartRuns (awp_db.batch_runs): one row per entry, its id chosen by the caller so that
-- each answer finds its entry; an entry whose request_id is taken inserts nothing
-- (the caller reads those runs: by_request_ids). A delayed start as `insert`'s.
INSERT INTO runs (id, workflow_id, input, concurrency, request_id, started_by, start_at,
                  awaiting_start, trace_id, trace_span, trace_parent, trace_pending, priority)
SELECT e.id, e.workflow_id, e.input::jsonb, e.concurrency, e.request_id, :started_by, s.at,
       coalesce(s.at > clock_timestamp(), false), e.trace_id, e.trace_span, e.trace_parent,
       e.trace_id IS NOT NULL, e.priority
  FROM unnest(:ids::uuid[], :workflow_ids::bigint[], :inputs::text[], :concurrency::int[],
              :request_ids::text[], :start_at::timestamptz[], :delay_ms::bigint[],
              :trace_ids::text[], :trace_spans::text[], :trace_parents::text[],
              :priorities::int[]) WITH ORDINALITY
       AS e (id, workflow_id, input, concurrency, request_id, at, delay_ms, trace_id,
             trace_span, trace_parent, priority, ord)
  CROSS JOIN LATERAL (SELECT coalesce(e.at, clock_timestamp()
                                            + e.delay_ms * interval '1 millisecond') AS at) s
 ORDER BY e.ord
ON CONFLICT (request_id) DO NOTHING
RETURNING id, awaiting_start

-- name: by_request_ids
SELECT request_id, id FROM runs WHERE request_id = ANY($1::text[])

-- name: get
SELECT r.id, r.state, r.revision, r.last_seq, r.input, r.request_id, r.created_at, r.finished_at,
       r.cancel_requested_at, r.cancel_reason, r.concurrency, r.started_by,
       r.cancel_requested_by, w.name AS workflow_name,
       w.version AS workflow_version, r.retried_from, r.retry_from_task, r.schedule_id,
       r.schedule_tick, r.start_at, r.trace_id, r.priority
  FROM runs r JOIN workflows w ON w.id = r.workflow_id
 WHERE r.id = $1

-- name: task_counts
SELECT run_id, state, count(*) AS n FROM tasks WHERE run_id = ANY($1::uuid[]) GROUP BY run_id, state

-- name: tasks
-- Declared tasks first, then each map's elements in index order (they are created so):
-- up to $4 of them (NULL: all) after the task id $3 (0: from the first).
-- Outputs over $2 bytes of JSON text are left out (output_omitted): GetTaskOutput.
SELECT t.id, t.key, t.state, t.executor_kind, t.action, t.depends_on, t.attempts, t.max_attempts,
       CASE WHEN octet_length(t.output::text) <= $2 THEN t.output END AS output,
       coalesce(octet_length(t.output::text) > $2, false) AS output_omitted, t.error,
       t.retry_at, t.finished_at, t.reused_from_run_id, t.hand_backs,
       p.key AS map_parent, t.map_index,
       t.saved_steps, t.saved_tokens, t.saved_cost_usd, t.suspensions, t.wait_kind,
       t.wait_name, t.wait_prompt, t.wait_role, t.wait_since, t.wait_due_at, t.wait_attempt
  FROM tasks t LEFT JOIN tasks p ON p.id = t.parent_id
 WHERE t.run_id = $1 AND t.id > $3
 ORDER BY t.id
 LIMIT $4

-- name: attempts
-- The first $2 (NULL: all), oldest first.
SELECT t.key AS task_key, a.attempt, a.state, a.worker_id, a.dispatch_id, a.fencing_token,
       a.started_at, a.deadline, a.finished_at, a.error
  FROM attempts a JOIN tasks t ON t.id = a.task_id
 WHERE a.run_id = $1
 ORDER BY a.id
 LIMIT $2

-- name: attempt_count
SELECT count(*) FROM attempts WHERE run_id = $1

-- name: request_cancel
UPDATE runs SET cancel_requested_at = now(), cancel_reason = $2, cancel_requested_by = $3
 WHERE id = $1 AND state = 'running' AND cancel_requested_at IS NULL
RETURNING id

-- name: progress
-- What a watcher needs to know whether it has seen everything: cheap, no join.
SELECT state, last_seq FROM runs WHERE id = $1

-- name: list
-- Newest first, keyset paging on (created_at, id) over the runs_created index. A NULL
-- filter matches every run; $3/$4 (the last run of the previous page) NULL: first page.
-- The keyset bound is always a plain row comparison (never "$3 IS NULL OR ..."), so even
-- a generic plan starts the index scan at the page instead of filtering up to it.
SELECT r.id, r.state, r.revision, r.last_seq, r.input, r.request_id, r.created_at, r.finished_at,
       r.cancel_requested_at, r.cancel_reason, r.concurrency, r.started_by,
       r.cancel_requested_by, w.name AS workflow_name,
       w.version AS workflow_version, r.retried_from, r.retry_from_task, r.schedule_id,
       r.schedule_tick, r.start_at, r.trace_id, r.priority
  FROM runs r JOIN workflows w ON w.id = r.workflow_id
 WHERE ($1::text IS NULL OR w.name = $1)
   AND ($2::text IS NULL OR r.state = $2)
   AND (r.created_at, r.id) < (coalesce($3::timestamptz, 'infinity'),
                               coalesce($4::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
 ORDER BY r.created_at DESC, r.id DESC
 LIMIT $5
