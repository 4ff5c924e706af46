"""Every limit of the protocol: what the server refuses, so clients can refuse it first."""

from __future__ import annotations

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

# --- workers (Register, Claim, Complete)
MAX_WORKER_NAME_CHARS: Final = 128
MAX_WORKER_CONCURRENCY: Final = 1000
MAX_LABELS: Final = 64
MAX_LABEL_VALUE_CHARS: Final = 256
MAX_LEASES_PER_CLAIM: Final = 1000
MAX_RESULTS_PER_COMPLETE: Final = 500
MAX_OUTPUT_BYTES: Final = 1024 * 1024  # a task's output, as canonical JSON
MAX_ERROR_MESSAGE_CHARS: Final = 8 * 1024
