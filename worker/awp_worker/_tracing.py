"""The worker's spans (docs/observability.md): each attempt, the action's own code as
its child, the Complete that reports it, and what happened to its lease.

An attempt's span is a child of its run's span (the lease's traceparent), so the worker
joins the run's trace without knowing any other process; a lease without one (a run
that is not traced) gets no span. The action runs inside its span, so whatever the
action's code traces itself (an HTTP or model client) nests under it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from awp_common import tracing
from awp_worker._lease import HeldLease

if TYPE_CHECKING:
    from opentelemetry.trace import Span


@contextlib.contextmanager
def attempt(held: HeldLease, worker_id: str) -> Iterator[None]:
    """The attempt's span around its execution; its outcome is `held.outcome` then."""
    lease = held.lease
    run = tracing.TraceRef.parse(lease.traceparent) if tracing.enabled() else None
    if run is None:
        yield
        return
    attributes: tracing.Attributes = {
        tracing.RUN_ID: lease.run_id,
        tracing.TASK_KEY: lease.task_key,
        tracing.ATTEMPT: lease.attempt,
        tracing.WORKER_ID: worker_id,
        tracing.FENCING_TOKEN: lease.fencing_token,
        tracing.DISPATCH_ID: lease.dispatch_id,
        tracing.ACTION: lease.action,
    }
    with tracing.span(tracing.ATTEMPT_SPAN, run, attributes) as span:
        held.span = span
        try:
            yield
        finally:
            if span is not None:
                _close(held, span)


def _close(held: HeldLease, span: Span) -> None:
    span.set_attribute(tracing.OUTCOME, held.outcome or "cancelled")
    if held.cancel_reason is not None:
        span.set_attribute("awp.cancel_reason", held.cancel_reason)
    if held.stream is not None:
        chunks, size, appends = held.stream.summary()
        if chunks:
            span.set_attribute("awp.stream.chunks", chunks)
            span.set_attribute("awp.stream.bytes", size)
            span.set_attribute("awp.stream.appends", appends)


def action(held: HeldLease) -> contextlib.AbstractContextManager[object]:
    """The action's own code: a child of the attempt's span, current while it runs."""
    if held.span is None:
        return contextlib.nullcontext()
    return tracing.span(tracing.ACTION_SPAN, attributes={tracing.ACTION: held.lease.action})


def revoked(held: HeldLease, status: str) -> None:
    """The server took the lease back while the attempt ran: an event on its span."""
    if held.span is not None and held.span.is_recording():
        held.span.add_event(tracing.REVOKED_EVENT, {"awp.status": status})


def submitted(held: HeldLease) -> None:
    held.submitted_ns = tracing.now_ns()


def completed(held: HeldLease, outcome: str) -> None:
    """Complete answered for the attempt's result (accepted, duplicate, lease lost...):
    a span from the result's hand-over to the answer, a child of the attempt's."""
    if held.span is None or held.submitted_ns is None:
        return
    context = held.span.get_span_context()
    tracing.record(
        tracing.COMPLETE_SPAN,
        tracing.TraceRef(f"{context.trace_id:032x}", f"{context.span_id:016x}"),
        held.submitted_ns,
        tracing.now_ns(),
        {tracing.OUTCOME: outcome, tracing.FENCING_TOKEN: held.lease.fencing_token},
    )
