"""The server's spans about runs (docs/observability.md): each leased task's wait.

A span about a run is a child of the run's span, found from the run's stored trace
(awp_common.tracing), whichever process exports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from awp_common import tracing
from awp_db.claims import IssuedLease


def queue_waits(issued: Sequence[IssuedLease], worker_id: str) -> None:
    """One span per traced lease: from its task becoming ready to this lease."""
    if not tracing.enabled():
        return
    for lease in issued:
        if lease.trace is None or lease.ready_at is None:
            continue
        tracing.record(
            tracing.QUEUE_WAIT_SPAN,
            lease.trace,
            tracing.ns(lease.ready_at),
            tracing.ns(lease.leased_at),
            {
                tracing.RUN_ID: str(lease.run_id),
                tracing.TASK_KEY: lease.task_key,
                tracing.ATTEMPT: lease.attempt,
                tracing.WORKER_ID: worker_id,
                tracing.FENCING_TOKEN: lease.fencing_token,
                tracing.DISPATCH_ID: lease.dispatch_id,
            },
        )
