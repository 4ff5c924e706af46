"""The worker's spans (docs/observability.md): each attempt, with the action's own code
as its child, the Complete that reports it, and what happened to its lease.

An attempt's span is a child of its run's span (the lease's traceparent), so the worker
joins the run's trace without knowing any other process; a lease without one (a run
that is not traced) gets no span. The action runs inside the attempt's span, so
whatever its code traces itself (an HTTP or model client) nests under it. The span lasts
until the lease is let go: its Complete's answer is an attribute of it (no span of its
own, which would cost as much again per task); a revocation is an event on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from awp_common import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from awp_sdk.waits import WaitSpec
    from awp_worker._lease import HeldLease


@contextlib.contextmanager
def attempt(held: HeldLease, worker_id: str, still_held: Callable[[], bool]) -> Iterator[None]:
    """The attempt's span, current around its execution; its outcome is `held.outcome`
    then. It ends here if the lease is gone already, else when it is let go (`released`)."""
    lease = held.lease
    run = tracing.TraceRef.parse(lease.traceparent) if tracing.enabled() else None
    span = None if run is None else tracing.start(
        tracing.ATTEMPT_SPAN,
        run,
        {
            tracing.RUN_ID: lease.run_id,
            tracing.TASK_KEY: lease.task_key,
            tracing.ATTEMPT: lease.attempt,
            tracing.WORKER_ID: worker_id,
            tracing.FENCING_TOKEN: lease.fencing_token,
            tracing.DISPATCH_ID: lease.dispatch_id,
            tracing.ACTION: lease.action,
        },
    )  # fmt: skip
    if span is None:
        yield
        return
    held.span = span
    try:
        with tracing.current(span):
            yield
    finally:
        _executed(held, span)
        if still_held():
            held.span_ends_on_release = True
        else:
            span.end()


def _executed(held: HeldLease, span: Span) -> None:
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
    """The action's own code: a child of the attempt's span, current while it runs (no
    attributes: its parent, the attempt's span, names the action)."""
    if held.span is None:
        return contextlib.nullcontext()
    return tracing.span(tracing.ACTION_SPAN)


def revoked(held: HeldLease, status: str) -> None:
    """The server took the lease back: an event on the attempt's span."""
    if held.span is not None and held.span.is_recording():
        held.span.add_event(tracing.REVOKED_EVENT, {"awp.status": status})


def suspended(held: HeldLease, spec: WaitSpec) -> None:
    """The attempt reached a wait not yet satisfied and ended SUSPENDED: an event on its
    span (the wait's own span, suspended -> resumed, is recorded where it is resumed)."""
    if held.span is not None and held.span.is_recording():
        held.span.add_event(
            tracing.SUSPENDED_EVENT,
            {
                tracing.WAIT_KIND: spec.kind,
                tracing.WAIT_NAME: spec.name,
                tracing.WAIT_OCCURRENCE: spec.occurrence,
            },
        )


def completed(held: HeldLease, outcome: str) -> None:
    """Complete answered for the attempt's result (accepted, duplicate, lease lost...):
    an attribute, not an event, since the span ends at the answer (an event would say
    nothing more, and costs its creation and its encoding)."""
    if held.span is not None and held.span.is_recording():
        held.span.set_attribute(tracing.COMPLETE_OUTCOME, outcome)


def released(held: HeldLease) -> None:
    """The lease is let go (settled, revoked, given up): its span, if still open, ends."""
    if held.span_ends_on_release and held.span is not None:
        held.span_ends_on_release = False
        held.span.end()
