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

# --- runs (StartRun, CancelRun, WatchRun, the list calls)
MAX_REQUEST_ID_CHARS: Final = 128
MAX_CANCEL_REASON_CHARS: Final = 1024
MAX_SEQ: Final = 2**63 - 1  # seq is a PostgreSQL bigint
MAX_PAGE_SIZE: Final = 1000
MAX_PRUNE_RUNS: Final = 10_000  # runs one PruneRuns call deletes (or counts)

# --- workers (Register, Claim, Complete)
MAX_WORKER_NAME_CHARS: Final = 128
MAX_WORKER_CONCURRENCY: Final = 1000
MAX_LABELS: Final = 64
MAX_LABEL_VALUE_CHARS: Final = 256
MAX_LEASES_PER_CLAIM: Final = 1000
MAX_RESULTS_PER_COMPLETE: Final = 500
MAX_OUTPUT_BYTES: Final = 1024 * 1024  # a task's output, as canonical JSON
MAX_ERROR_MESSAGE_CHARS: Final = 8 * 1024
MAX_EXECUTOR_KINDS: Final = 32
MAX_EXECUTOR_KIND_CHARS: Final = 32
MAX_LABEL_KEY_CHARS: Final = 63
MAX_CLAIM_WAIT_MS: Final = 5 * 60 * 1000  # a Claim's long poll; the server may cap it lower

# --- every request (checked for every RPC before its handler runs: awp_protocol.wire)
# A request's serialised size. A Complete of results that do not fit in one request goes
# out in several; one result alone always fits: its output's protobuf encoding is at most
# ~5.5x its canonical JSON (a list of zeros: 2 JSON bytes, 11 protobuf bytes each).
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
# The transport refuses (RESOURCE_EXHAUSTED, without details) only beyond twice that, so
# that a request somewhat too large is answered INVALID_ARGUMENT / REQUEST_TOO_LARGE.
TRANSPORT_RECEIVE_BYTES: Final = 2 * MAX_REQUEST_BYTES
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

# The length of every string field of every request, by field (awp_protocol.wire checks
# them all; a test checks that none is missing).
TEXT_LIMITS: Final[Mapping[str, int]] = {
    "awp.v1.Session.worker_id": MAX_ID_CHARS,
    "awp.v1.Session.session_token": MAX_TOKEN_CHARS,
    "awp.v1.RegisterRequest.name": MAX_WORKER_NAME_CHARS,
    "awp.v1.RegisterRequest.executor_kinds": MAX_EXECUTOR_KIND_CHARS,
    "awp.v1.RegisterRequest.LabelsEntry.key": MAX_LABEL_KEY_CHARS,
    "awp.v1.RegisterRequest.LabelsEntry.value": MAX_LABEL_VALUE_CHARS,
    "awp.v1.LeaseRef.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.TaskResult.lease_token": MAX_TOKEN_CHARS,
    "awp.v1.TaskError.message": MAX_ERROR_MESSAGE_CHARS,
    "awp.v1.WorkflowDefinition.name": MAX_NAME_CHARS,
    "awp.v1.WorkflowDefinition.description": MAX_DESCRIPTION_CHARS,
    "awp.v1.TaskDefinition.key": MAX_TASK_KEY_CHARS,
    "awp.v1.TaskDefinition.executor_kind": MAX_EXECUTOR_KIND_CHARS,
    "awp.v1.TaskDefinition.action": MAX_ACTION_CHARS,
    "awp.v1.TaskDefinition.depends_on": MAX_TASK_KEY_CHARS,
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
    "awp.v1.WatchRunRequest.run_id": MAX_ID_CHARS,
    "awp.v1.PruneRunsRequest.page_token": MAX_PAGE_TOKEN_CHARS,
}
# The element count of every repeated field and map of every request.
COUNT_LIMITS: Final[Mapping[str, int]] = {
    "awp.v1.RegisterRequest.executor_kinds": MAX_EXECUTOR_KINDS,
    "awp.v1.RegisterRequest.labels": MAX_LABELS,
    "awp.v1.HeartbeatRequest.leases": MAX_WORKER_CONCURRENCY,
    "awp.v1.CompleteRequest.results": MAX_RESULTS_PER_COMPLETE,
    "awp.v1.DrainRequest.hand_back": MAX_WORKER_CONCURRENCY,
    "awp.v1.WorkflowDefinition.tasks": MAX_TASKS,
    "awp.v1.TaskDefinition.depends_on": MAX_DEPENDENCIES,
}
