"""The coordinator's spans (docs/observability.md): each finished run's own span, the
attempts it ended itself (a rescue: their workers, gone, report nothing), and its
dispatch and reaping steps where they did work, which explain a task's wait.

The run's span is exported here, after the fact, with the ids StartRun fixed for it:
every other process has parented its spans to those ids meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from awp_common import tracing
from awp_db import traces
from awp_db.connect import Conn

# Why the coordinator ended a lease, as the rescue event says.
EXPIRED: str = "lease expired"
OFFLINE: str = "worker offline"


async def finished_runs(conn: Conn, limit: int) -> int:
    """Exports the span of every run finished since the last pass; returns how many."""
    done = await traces.finished_runs(conn, limit)
    for run in done:
        tracing.record(
            tracing.RUN_SPAN,
            tracing.TraceRef(run.trace_id, run.trace_parent) if run.trace_parent else None,
            tracing.ns(run.created_at),
            tracing.ns(run.finished_at),
            {
                tracing.RUN_ID: str(run.id),
                tracing.WORKFLOW: run.workflow_name,
                "awp.workflow_version": run.workflow_version,
                tracing.OUTCOME: run.state,
            },
            ids=tracing.TraceRef(run.trace_id, run.trace_span),
            error=None if run.state == "succeeded" else f"run {run.state}",
        )
    return len(done)


async def rescued(conn: Conn, dispatch_ids: Sequence[int], why: str) -> list[tracing.TraceRef]:
    """A span for each attempt the coordinator ended, in its run's trace: from its start
    to the rescue, with the lease's expiry and the rescue as events. Returns the runs'
    spans (the reaping step's span links them)."""
    ended = await traces.ended_attempts(conn, dispatch_ids)
    for attempt in ended:
        end = tracing.ns(attempt.finished_at)
        events = [tracing.Event(tracing.RESCUE_EVENT, end, {"awp.reason": why})]
        if attempt.lease_expires_at is not None and why == EXPIRED:
            expired = tracing.ns(attempt.lease_expires_at)
            events.insert(0, tracing.Event(tracing.EXPIRED_EVENT, expired))
        tracing.record(
            tracing.ATTEMPT_SPAN,
            tracing.TraceRef(attempt.trace_id, attempt.trace_span),
            tracing.ns(attempt.started_at),
            end,
            {
                tracing.RUN_ID: str(attempt.run_id),
                tracing.TASK_KEY: attempt.task_key,
                tracing.ATTEMPT: attempt.attempt,
                tracing.WORKER_ID: str(attempt.worker_id),
                tracing.FENCING_TOKEN: attempt.fencing_token,
                tracing.DISPATCH_ID: attempt.dispatch_id,
                tracing.OUTCOME: attempt.state,
            },
            events=events,
            error=why,
        )
    return [tracing.TraceRef(a.trace_id, a.trace_span) for a in ended]


def step(name: str, start_ns: int, count: int, links: Sequence[tracing.TraceRef] = ()) -> None:
    """A pass's step that did work, as its own short trace (it serves many runs; the
    runs' spans are linked when known)."""
    if count:
        tracing.record(name, None, start_ns, tracing.now_ns(), {"awp.count": count}, links=links)
