"""Every limit of the protocol: what the server refuses, so clients can refuse it first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

PROTOCOL_VERSION: Final = 1
SUPPORTED_PROTOCOL_VERSIONS: Final = (PROTOCOL_VERSION,)

# --- workflow definitions (CreateWorkflow)
MAX_VERSION: Final = 2**31 - 1  # the workflows.version column is a PostgreSQL integer
MAX_TASKS: Final = 10_000
MAX_INPUT_BYTES: Final = 64 * 1024  # a task's or a run's input, as canonical JSON
MAX_DESCRIPTION_CHARS: Final = 1_024
MAX_CONCURRENCY: Final = 10_000  # a workflow's running tasks per run; 0 is unlimited
MAX_ATTEMPTS: Final = 100
MIN_TIMEOUT_MS: Final = 10
MAX_DURATION_MS: Final = 24 * 3600 * 1000
MAX_BACKOFF_MULTIPLIER: Final = 10.0
DEFAULT_TIMEOUT_MS: Final = 5 * 60 * 1000
# A map task runs once per element of a list in its upstream's output (TaskDefinition.map):
# a longer list fails the map task, and so does an element whose input (the task's input
# plus the element) would be over MAX_INPUT_BYTES. Its output, the list of its elements'
# outputs, is a task output like any other: at most MAX_OUTPUT_BYTES (measured as
# PostgreSQL prints the JSON, never shorter than canonical JSON).
MAX_MAP_ELEMENTS: Final = 1_000
MAX_MAP_PATH_CHARS: Final = 256
# Concurrency keys (TaskDefinition.concurrency_limits, awp_kernel.concurrency): a task's
# limits, each a key template and the most live leases holding the key it renders to.
MAX_CONCURRENCY_LIMITS: Final = 4
MAX_KEY_TEMPLATE_CHARS: Final = 256
MAX_CONCURRENCY_KEY_CHARS: Final = 512  # a rendered key
MAX_KEYED_CONCURRENCY: Final = 100_000
# Rate limits and token budgets (TaskDefinition.rate_limits, SetRateLimit): a task's uses,
# the units one use and one limit may count, and the period of a limit.
MAX_RATE_USES: Final = 4
MAX_RATE_UNITS: Final = 10**15
MAX_RATE_UNITS_CHARS: Final = 256
MAX_RATE_PERIOD_MS: Final = 24 * 3600 * 1000
MAX_SLOW_DOWN_MS: Final = 3600 * 1000

# --- runs (StartRun, CancelRun, WatchRun, the list calls)
MAX_REQUEST_ID_CHARS: Final = 128
# Entries of one StartRuns call (its inputs are bounded by the request's size too).
MAX_START_RUNS: Final = 1000
MAX_CANCEL_REASON_CHARS: Final = 1024
MAX_SEQ: Final = 2**63 - 1  # seq is a PostgreSQL bigint
MAX_PAGE_SIZE: Final = 1000
# GetRun lists at most this many tasks and as many attempts (its answer's budget would
# hold about 50,000 bare tasks, but reading and converting them all would cost the
# server more than a page): every declared task fits; beyond are map elements, which
# ListTasks pages through.
MAX_GET_RUN_ROWS: Final = MAX_TASKS
# ListAttempts: a page of attempts at every limit above (type, message, traceback, log
# tail: ~33,000 characters, up to 4 UTF-8 bytes each) stays under the 4 MiB a gRPC client
# receives by default.
MAX_ATTEMPTS_PAGE_SIZE: Final = 25
MAX_PRUNE_RUNS: Final = 10_000  # runs one PruneRuns call deletes (or counts)

# --- schedules (docs/schedules.md; the calendar's own bounds are awp_kernel.schedules)
MAX_CRON_CHARS: Final = 256
MAX_TIMEZONE_CHARS: Final = 64  # the longest IANA name is 32
MAX_START_DELAY_MS: Final = 366 * 24 * 3600 * 1000  # StartRun's start_delay
# A run's priority (StartRun) and a task's (its definition); a task's base priority is
# their sum clamped to the same range (docs/workflows.md "Priorities"; migration 0019).
MIN_PRIORITY: Final = -10
MAX_PRIORITY: Final = 10

# --- workers (Register, Claim, Complete)
MAX_WORKER_NAME_CHARS: Final = 128
MAX_WORKER_CONCURRENCY: Final = 1000
MAX_LABELS: Final = 64
MAX_LABEL_VALUE_CHARS: Final = 256
# Placement (awp_protocol.placement, docs/workflows.md "Placement"): the models a worker
# advertises (each the label "model=<name>"), its countable resources and their
# capacities; a task's required and preferred labels (each list) and the resources it
# reserves.
MAX_MODELS: Final = 64
MAX_RESOURCES: Final = 16
MAX_RESOURCE_UNITS: Final = 1_000_000
MAX_TASK_LABELS: Final = 16
MAX_LABEL_KEY_CHARS: Final = 63
MAX_PLACEMENT_LABEL_CHARS: Final = MAX_LABEL_KEY_CHARS + 1 + MAX_LABEL_VALUE_CHARS  # "key=value"
MAX_LEASES_PER_CLAIM: Final = 1000
MAX_RESULTS_PER_COMPLETE: Final = 500
MAX_OUTPUT_BYTES: Final = 1024 * 1024  # a task's output, as canonical JSON
MAX_ERROR_MESSAGE_CHARS: Final = 8 * 1024
# What a failed attempt keeps beyond its message (TaskError): its exception's type, its
# traceback (cut from the outside in, keeping the innermost frames) and the action's last
# log lines (the newest kept). A worker bounds them; the server refuses more.
MAX_ERROR_TYPE_CHARS: Final = 256
MAX_TRACEBACK_CHARS: Final = 16 * 1024
MAX_LOG_TAIL_CHARS: Final = 8 * 1024
MAX_LOG_TAIL_LINES: Final = 50
MAX_EXECUTOR_KINDS: Final = 32
MAX_EXECUTOR_KIND_CHARS: Final = 32
MAX_CLAIM_WAIT_MS: Final = 5 * 60 * 1000  # a Claim's long poll; the server may cap it lower
# Leases of a task handed back by draining workers (DrainRequest.hand_back) free of
# charge: no attempt spent, no backoff. Past this, a hand-back is charged as an ordinary
# interruption, so a task that makes every worker give up still meets its retry rule.
MAX_FREE_HAND_BACKS: Final = 10

# --- JSON values (inputs, outputs, event payloads: google.protobuf.Struct)
# A Struct holds every number as an IEEE-754 double, exact for integers up to 2**53 in
# magnitude. Clients refuse a larger integer instead of sending it rounded
# (awp_protocol.jsonvalue.to_struct); an integral number within it comes back an int.
MAX_EXACT_INT: Final = 2**53

# --- every request (checked for every RPC before its handler runs: awp_protocol.wire)
# A request's serialised size. A Complete of results that do not fit in one request goes
# out in several; one result alone always fits: its output's protobuf encoding is at most
# ~5.5x its canonical JSON (a list of zeros: 2 JSON bytes, 11 protobuf bytes each).
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
# The transport refuses (RESOURCE_EXHAUSTED, without details) only beyond twice that, so
# that a request somewhat too large is answered INVALID_ARGUMENT / REQUEST_TOO_LARGE.
TRANSPORT_RECEIVE_BYTES: Final = 2 * MAX_REQUEST_BYTES
# --- every answer: at most this serialised, so that any gRPC client's default 4 MiB
# receive limit takes it. An answer that could be larger leaves parts out and says which
# (a Claim issues fewer leases; a lease or GetRun names the outputs to fetch on their own).
MAX_RESPONSE_BYTES: Final = 3 * 1024 * 1024
# Canonical JSON as a protobuf Struct: at most 5.5 bytes per JSON byte (see above).
STRUCT_BYTES_PER_JSON_BYTE: Final = 6
# Outputs up to this size (canonical JSON) travel inside a Lease or a GetRun answer while
# the budget lasts; larger ones only on their own (GetUpstreamOutputs, GetTaskOutput).
MAX_INLINE_OUTPUT_JSON_BYTES: Final = 64 * 1024
# One Claim statement's leases carry inputs (the task's and the run's, as JSON) adding up
# to at most this; the first lease is always issued. A Claim runs at most two statements
# per executor-kind set, so its leases' inputs encode to at most 2 x 6 x 128 KiB = 1.5 MiB,
# and their fixed fields (under 1 KiB each, 1,000 leases at most) to 1 MiB: the rest of
# MAX_RESPONSE_BYTES carries inline upstream outputs.
MAX_CLAIM_INPUT_JSON_BYTES: Final = 2 * MAX_INPUT_BYTES
# Nesting of a JSON value (Struct): the top-level object is 1. A Struct level costs three
# protobuf message levels, and protobuf decodes at most 100: 32 is the deepest a Lease's
# upstream output can be and still reach a worker.
MAX_JSON_DEPTH: Final = 32
MAX_ID_CHARS: Final = 64  # worker and run ids (UUIDs)
MAX_TOKEN_CHARS: Final = 128  # session and lease tokens
MAX_PAGE_TOKEN_CHARS: Final = 512
MAX_NAME_CHARS: Final = 128  # a workflow's name
MAX_TASK_KEY_CHARS: Final = 64
MAX_ACTION_CHARS: Final = 128
MAX_DEPENDENCIES: Final = 1_000  # a task's depends_on
# An error lists at most this many violations and quotes at most QUOTE_CHARS characters
# of any input: its message and details must fit in the trailing metadata a gRPC client
# accepts (8 KiB by default), or the client sees RESOURCE_EXHAUSTED instead.
MAX_REPORTED_VIOLATIONS: Final = 10
QUOTE_CHARS: Final = 40

# --- output streams (AppendStream, WatchStream; docs/design.md §15)
# A chunk's text (or JSON as text), in characters; a longer one is refused, never cut.
MAX_STREAM_CHUNK_CHARS: Final = 64 * 1024
MAX_STREAM_CHUNKS_PER_APPEND: Final = 1_000
# UTF-8 bytes one attempt may stream in all: an append past it is STREAM_LIMIT.
MAX_STREAM_BYTES_PER_ATTEMPT: Final = 16 * 1024 * 1024
# Open WatchStream calls one server serves at once: one more is STREAM_LIMIT.
MAX_STREAM_READERS_PER_SERVER: Final = 1_000
# Chunks a WatchStream reads from PostgreSQL at a time (and sends in one message).
STREAM_READ_BATCH: Final = 500

# --- step checkpoints (LoadCheckpoints, RecordStep; docs/design.md §16)
# One memo's value, as canonical JSON; and what one task may store in all (every
# attempt's memos together): past any of them RecordStep answers MEMO_LIMIT, naming it.
MAX_MEMO_BYTES: Final = 256 * 1024
MAX_MEMOS_PER_TASK: Final = 1_000
MAX_MEMO_BYTES_PER_TASK: Final = 16 * 1024 * 1024
# A LoadCheckpoints page holds memos whose values add up to at most this (the first
# always fits: one memo is at most MAX_MEMO_BYTES), under MAX_RESPONSE_BYTES.
MAX_CHECKPOINT_PAGE_BYTES: Final = 2 * 1024 * 1024
# A step's name (and a signal's or an approval's): what the action calls it.
MAX_CHECKPOINT_NAME_CHARS: Final = 128

# --- waits, signals and approvals (Await, SendSignal, Approve, Reject; §16)
# A sleep, and a wait's or an approval task's timeout.
MAX_WAIT_MS: Final = 366 * 24 * 3600 * 1000
# An approval's prompt, and a decision's comment.
MAX_PROMPT_CHARS: Final = 4 * 1024
MAX_COMMENT_CHARS: Final = 4 * 1024
# A signal's payload, as canonical JSON (as one memo: the wait stores it as its checkpoint).
MAX_SIGNAL_PAYLOAD_BYTES: Final = MAX_MEMO_BYTES
# The role a wait may ask for (awp_protocol.roles: approver or admin).
MAX_ROLE_CHARS: Final = 32

# The length of every string field of every request, by field (awp_protocol.wire checks
# them all; a test checks that none is missing).
TEXT_LIMITS: Final[Mapping[str, int]] = {
    "awp.v1.Session.worker_id": MAX_ID_CHARS,
    "awp.v1.Session.session_token": MAX_TOKEN_CHARS,
    "awp.v1.RegisterRequest.name": MAX_WORKER_NAME_CHARS,
    "awp.v1.RegisterRequest.executor_kinds": MAX_EXECUTOR_KIND_CHARS,
    "awp.v1.RegisterRequest.LabelsEntry.key": MAX_LABEL_KEY_CHARS,
    "awp.v1.RegisterRequest.LabelsEntry.value": MAX_LABEL_VALUE_CHARS,
    "awp.v1.RegisterRequest.models": MAX_LABEL_VALUE_CHARS,
    "awp.v1.RegisterRequest.ResourcesEntry.key": MAX_LABEL_KEY_CHARS,
    "awp.v1.LeaseRef.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.TaskResult.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.TaskError.message": MAX_ERROR_MESSAGE_CHARS,
    "awp.v1.TaskError.type": MAX_ERROR_TYPE_CHARS,
    "awp.v1.TaskError.traceback": MAX_TRACEBACK_CHARS,
    "awp.v1.TaskError.log_tail": MAX_LOG_TAIL_CHARS,
    "awp.v1.WorkflowDefinition.name": MAX_NAME_CHARS,
    "awp.v1.WorkflowDefinition.description": MAX_DESCRIPTION_CHARS,
    "awp.v1.TaskDefinition.key": MAX_TASK_KEY_CHARS,
    "awp.v1.TaskDefinition.executor_kind": MAX_EXECUTOR_KIND_CHARS,
    "awp.v1.TaskDefinition.action": MAX_ACTION_CHARS,
    "awp.v1.TaskDefinition.required_labels": MAX_PLACEMENT_LABEL_CHARS,
    "awp.v1.TaskDefinition.preferred_labels": MAX_PLACEMENT_LABEL_CHARS,
    "awp.v1.TaskDefinition.ResourcesEntry.key": MAX_LABEL_KEY_CHARS,
    "awp.v1.TaskDefinition.depends_on": MAX_TASK_KEY_CHARS,
    "awp.v1.TaskMap.over": MAX_TASK_KEY_CHARS,
    "awp.v1.ConcurrencyLimit.key": MAX_KEY_TEMPLATE_CHARS,
    "awp.v1.RateUse.limit": MAX_NAME_CHARS,
    "awp.v1.RateUse.units": MAX_RATE_UNITS_CHARS,
    "awp.v1.RateLimitSpec.name": MAX_NAME_CHARS,
    "awp.v1.GetRateLimitRequest.name": MAX_NAME_CHARS,
    "awp.v1.RateUsage.limit": MAX_NAME_CHARS,
    "awp.v1.SlowDown.limit": MAX_NAME_CHARS,
    "awp.v1.TaskMap.path": MAX_MAP_PATH_CHARS,
    "awp.v1.GetWorkflowRequest.name": MAX_NAME_CHARS,
    "awp.v1.ListWorkflowsRequest.name": MAX_NAME_CHARS,
    "awp.v1.ListWorkflowsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.StartRunRequest.workflow_name": MAX_NAME_CHARS,
    "awp.v1.StartRunRequest.request_id": MAX_REQUEST_ID_CHARS,
    "awp.v1.GetRunRequest.run_id": MAX_ID_CHARS,
    "awp.v1.ListRunsRequest.workflow_name": MAX_NAME_CHARS,
    "awp.v1.ListRunsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.CancelRunRequest.run_id": MAX_ID_CHARS,
    "awp.v1.CancelRunRequest.reason": MAX_CANCEL_REASON_CHARS,
    "awp.v1.RetryRunRequest.run_id": MAX_ID_CHARS,
    "awp.v1.RetryRunRequest.from_task": MAX_TASK_KEY_CHARS,
    "awp.v1.RetryRunRequest.request_id": MAX_REQUEST_ID_CHARS,
    "awp.v1.GetUpstreamOutputsRequest.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.GetUpstreamOutputsRequest.keys": MAX_TASK_KEY_CHARS,
    "awp.v1.AppendStreamRequest.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.StreamChunkIn.text": MAX_STREAM_CHUNK_CHARS,
    "awp.v1.StreamChunkIn.json": MAX_STREAM_CHUNK_CHARS,
    "awp.v1.LoadCheckpointsRequest.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.LoadCheckpointsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.RecordStepRequest.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.RecordStepRequest.name": MAX_CHECKPOINT_NAME_CHARS,
    # Bounded by the request's size only: a memo past MAX_MEMO_BYTES is the handler's
    # MEMO_LIMIT, naming the memo size limit, not a length error.
    "awp.v1.RecordStepRequest.value_json": MAX_REQUEST_BYTES,
    "awp.v1.AwaitRequest.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.AwaitRequest.name": MAX_CHECKPOINT_NAME_CHARS,
    "awp.v1.AwaitRequest.prompt": MAX_PROMPT_CHARS,
    "awp.v1.AwaitRequest.role": MAX_ROLE_CHARS,
    "awp.v1.SendSignalRequest.run_id": MAX_ID_CHARS,
    "awp.v1.SendSignalRequest.name": MAX_CHECKPOINT_NAME_CHARS,
    "awp.v1.SendSignalRequest.request_id": MAX_REQUEST_ID_CHARS,
    "awp.v1.ApproveRequest.run_id": MAX_ID_CHARS,
    "awp.v1.ApproveRequest.task_key": MAX_TASK_KEY_CHARS,
    "awp.v1.ApproveRequest.comment": MAX_COMMENT_CHARS,
    "awp.v1.RejectRequest.run_id": MAX_ID_CHARS,
    "awp.v1.RejectRequest.task_key": MAX_TASK_KEY_CHARS,
    "awp.v1.RejectRequest.comment": MAX_COMMENT_CHARS,
    "awp.v1.WaitTaskDefinition.prompt": MAX_PROMPT_CHARS,
    "awp.v1.WaitTaskDefinition.role": MAX_ROLE_CHARS,
    "awp.v1.WatchStreamRequest.run_id": MAX_ID_CHARS,
    "awp.v1.WatchStreamRequest.task_key": MAX_TASK_KEY_CHARS,
    "awp.v1.GetTaskOutputRequest.run_id": MAX_ID_CHARS,
    "awp.v1.GetTaskOutputRequest.task_key": MAX_TASK_KEY_CHARS,
    "awp.v1.ListAttemptsRequest.run_id": MAX_ID_CHARS,
    "awp.v1.ListAttemptsRequest.task_key": MAX_TASK_KEY_CHARS,
    "awp.v1.ListAttemptsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.ListTasksRequest.run_id": MAX_ID_CHARS,
    "awp.v1.ListTasksRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.WatchRunRequest.run_id": MAX_ID_CHARS,
    "awp.v1.PruneRunsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.ScheduleSpec.name": MAX_NAME_CHARS,
    "awp.v1.ScheduleSpec.workflow_name": MAX_NAME_CHARS,
    "awp.v1.ScheduleSpec.cron": MAX_CRON_CHARS,
    "awp.v1.ScheduleSpec.timezone": MAX_TIMEZONE_CHARS,
    "awp.v1.GetScheduleRequest.name": MAX_NAME_CHARS,
    "awp.v1.ListSchedulesRequest.page_token": MAX_PAGE_TOKEN_CHARS,
    "awp.v1.PauseScheduleRequest.name": MAX_NAME_CHARS,
    "awp.v1.ResumeScheduleRequest.name": MAX_NAME_CHARS,
    "awp.v1.DeleteScheduleRequest.name": MAX_NAME_CHARS,
    "awp.v1.TriggerScheduleRequest.name": MAX_NAME_CHARS,
    "awp.v1.BackfillScheduleRequest.name": MAX_NAME_CHARS,
}
# The element count of every repeated field and map of every request.
COUNT_LIMITS: Final[Mapping[str, int]] = {
    "awp.v1.StartRunsRequest.runs": MAX_START_RUNS,
    "awp.v1.RegisterRequest.executor_kinds": MAX_EXECUTOR_KINDS,
    "awp.v1.RegisterRequest.labels": MAX_LABELS,
    "awp.v1.RegisterRequest.models": MAX_MODELS,
    "awp.v1.RegisterRequest.resources": MAX_RESOURCES,
    "awp.v1.HeartbeatRequest.leases": MAX_WORKER_CONCURRENCY,
    "awp.v1.CompleteRequest.results": MAX_RESULTS_PER_COMPLETE,
    "awp.v1.DrainRequest.hand_back": MAX_WORKER_CONCURRENCY,
    "awp.v1.GetUpstreamOutputsRequest.keys": MAX_DEPENDENCIES,
    "awp.v1.AppendStreamRequest.chunks": MAX_STREAM_CHUNKS_PER_APPEND,
    "awp.v1.WorkflowDefinition.tasks": MAX_TASKS,
    "awp.v1.TaskDefinition.depends_on": MAX_DEPENDENCIES,
    "awp.v1.TaskDefinition.concurrency_limits": MAX_CONCURRENCY_LIMITS,
    "awp.v1.TaskDefinition.rate_limits": MAX_RATE_USES,
    "awp.v1.TaskDefinition.required_labels": MAX_TASK_LABELS,
    "awp.v1.TaskDefinition.preferred_labels": MAX_TASK_LABELS,
    "awp.v1.TaskDefinition.resources": MAX_RESOURCES,
    "awp.v1.TaskResult.usage": MAX_RATE_USES,
    "awp.v1.TaskResult.slow_down": MAX_RATE_USES,
}
