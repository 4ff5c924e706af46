"""OpenTelemetry traces in every AWP process (docs/observability.md).

Off by default, and then close to free: nothing of OpenTelemetry is imported, and every
helper here returns after one check. It is on in a process whose environment asks for
traces in the standard way: an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER=otlp``/``console``,
unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. The official SDK
then reads the rest of the ``OTEL_*`` variables itself (service name, resource
attributes, sampler, the exporter's endpoint, headers, TLS, batch sizes). It needs the
``otel`` extra (``pip install 'awp[otel]'``); asked for without it, the process says so
and stops.

A run's spans come from processes that never talk to each other about it (the server
that leases a task, the worker that runs it, the coordinator that rescues it), so they
are joined through the run's stored trace context (`TraceRef`), not through in-process
context: each span about a run is a child of the run's own span, whose ids StartRun fixes,
and the coordinator exports that span itself once the run has finished, with those ids.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from awp_common.extras import OTEL

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from awp_common._otel import Otel

log = logging.getLogger("awp.tracing")

# Span attribute names: one home, shared by every process that emits them.
RUN_ID: Final = "awp.run_id"
TASK_KEY: Final = "awp.task_key"
ATTEMPT: Final = "awp.attempt"
WORKER_ID: Final = "awp.worker_id"
FENCING_TOKEN: Final = "awp.fencing_token"
DISPATCH_ID: Final = "awp.dispatch_id"
ACTION: Final = "awp.action"
OUTCOME: Final = "awp.outcome"
WORKFLOW: Final = "awp.workflow"

# Span names.
RUN_SPAN: Final = "awp.run"
QUEUE_WAIT_SPAN: Final = "awp.queue_wait"
ATTEMPT_SPAN: Final = "awp.attempt"
ACTION_SPAN: Final = "awp.action"
STEP_SPAN: Final = "awp.step"
WAIT_SPAN: Final = "awp.wait"
DISPATCH_SPAN: Final = "awp.coordinator.dispatch"
REAP_SPAN: Final = "awp.coordinator.reap"

# A step checkpoint's span (durable execution, docs/design.md §16): which call, whether
# its memo was replayed (hit) or the step ran (miss), and what it reported it cost.
STEP_NAME: Final = "awp.step.name"
STEP_OCCURRENCE: Final = "awp.step.occurrence"
STEP_HIT: Final = "awp.step.hit"
STEP_TOKENS: Final = "awp.step.tokens"
STEP_COST_USD: Final = "awp.step.cost_usd"
# A wait: which one, and what ended it (a signal, a decision, its timer).
WAIT_KIND: Final = "awp.wait.kind"
WAIT_NAME: Final = "awp.wait.name"
WAIT_OCCURRENCE: Final = "awp.wait.occurrence"
WAIT_RESUMED_BY: Final = "awp.wait.resumed_by"

# Span events: what happens to a lease that no peer's spans show.
REVOKED_EVENT: Final = "awp.lease.revoked"
EXPIRED_EVENT: Final = "awp.lease.expired"
RESCUE_EVENT: Final = "awp.rescue"
# The attempt reached a wait not yet satisfied: its lease ended, the task waits.
SUSPENDED_EVENT: Final = "awp.wait.suspended"
# Complete's answer for the attempt's result: an attribute of the attempt's span.
COMPLETE_OUTCOME: Final = "awp.complete.outcome"

# The W3C trace-context header, as gRPC metadata carries it (keys are lowercase).
TRACEPARENT: Final = "traceparent"

_TRACEPARENT: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True, slots=True)
class TraceRef:
    """A span's place in a trace: its trace id and span id, as lowercase hex."""

    trace_id: str
    span_id: str

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"

    @classmethod
    def parse(cls, header: str) -> TraceRef | None:
        """A sampled, valid W3C traceparent's ids; None for anything else."""
        found = _parse(header)
        return found[0] if found is not None and found[1] else None


def _parse(header: str) -> tuple[TraceRef, bool] | None:
    """A valid W3C traceparent's ids and its sampled flag; None if it is not valid."""
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None:
        return None
    trace_id, span_id, flags = match.groups()
    if not int(trace_id, 16) or not int(span_id, 16):
        return None
    return TraceRef(trace_id, span_id), bool(int(flags, 16) & 1)


def new_span_id() -> str:
    return secrets.token_hex(8)


def new_trace_id() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class RunTrace:
    """A run's trace as StartRun stores it: the run's own span, and its caller's span
    (None: the run's span is the root of a trace the server began)."""

    run: TraceRef
    caller_span: str | None

    @classmethod
    def begin(cls, caller: TraceRef | None) -> RunTrace | None:
        """The trace of a new run: the caller's, or a new one if this process traces
        and its sampler (``OTEL_TRACES_SAMPLER``) keeps it; None: the run is not traced."""
        if caller is not None:
            return cls(TraceRef(caller.trace_id, new_span_id()), caller.span_id)
        otel = _process.otel
        trace_id = new_trace_id()
        if otel is None or not otel.sampled(trace_id, RUN_SPAN):
            return None
        return cls(TraceRef(trace_id, new_span_id()), None)

    @classmethod
    def of_caller(cls, traceparent: str | None) -> RunTrace | None:
        """The trace of a run started with this traceparent (None: without one). A
        caller that does not sample its trace leaves the run untraced; a header that is
        not valid W3C is ignored, as if there were none."""
        found = None if traceparent is None else _parse(traceparent)
        if found is None:
            return cls.begin(None)
        caller, sampled = found
        return cls.begin(caller) if sampled else None


# --- the process's setup ---------------------------------------------------------------


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but the otel extra is not installed."""


class _Process:
    """This process's tracing: None while off (the default)."""

    otel: Otel | None = None


_process = _Process()


def requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard OTEL_* variables ask this process for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return exporter in ("otlp", "console") or any(environ.get(name) for name in endpoints)


def configure(service_name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Sets up tracing for this process if its environment asks for it; True if on.
    ``service_name`` is the default for ``OTEL_SERVICE_NAME``."""
    if _process.otel is None and requested(environ):
        problem = OTEL.problem("tracing (OTEL_* variables)")
        if problem is not None:
            raise TracingUnavailable(problem)
        # Only now, and only installed: the base install has no OpenTelemetry.
        from awp_common._otel import Otel  # noqa: PLC0415

        _process.otel = Otel(service_name, environ)
        log.info("tracing on: exporting spans", extra={"service": service_name})
    return _process.otel is not None


@contextlib.contextmanager
def process(service_name: str) -> Iterator[None]:
    """Tracing for a whole process's run (`configure`, then `shutdown` at its end). Asked
    for without the otel extra, the process says so in one line and exits 2."""
    try:
        configure(service_name)
    except TracingUnavailable as exc:
        print(f"{service_name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        yield
    finally:
        shutdown()


def enabled() -> bool:
    return _process.otel is not None


def shutdown() -> None:
    """Exports what is buffered (at a clean exit; a killed process loses it)."""
    otel, _process.otel = _process.otel, None
    if otel is not None:
        otel.shutdown()


# --- spans -----------------------------------------------------------------------------

Attributes = Mapping[str, str | int | float | bool]


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    at_ns: int
    attributes: Attributes | None = None


def now_ns() -> int:
    return time.time_ns()


def ns(instant: datetime) -> int:
    """A span time from a database timestamp (the database's clock)."""
    return int(instant.timestamp() * 1e9)


@contextlib.contextmanager
def span(
    name: str, parent: TraceRef | None = None, attributes: Attributes | None = None
) -> Iterator[Span | None]:
    """A span around the block, current within it (so spans the block starts nest under
    it), a child of ``parent`` if given, else of the current span; None when off."""
    otel = _process.otel
    if otel is None:
        yield None
        return
    with otel.span(name, parent, attributes) as current:
        yield current


@contextlib.contextmanager
def child(name: str, attributes: Attributes | None = None) -> Iterator[Span | None]:
    """A span around the block, a child of the current span, only when there is one
    that records (inside a traced attempt); None otherwise, so an untraced run's code
    never begins a trace of its own."""
    otel = _process.otel
    if otel is None or not otel.in_span():
        yield None
        return
    with otel.span(name, None, attributes) as current:
        yield current


def start(name: str, parent: TraceRef | None, attributes: Attributes | None = None) -> Span | None:
    """A span its caller ends (``span.end()``) whenever it is over, made current only
    within `current`; None when off."""
    otel = _process.otel
    return None if otel is None else otel.start(name, parent, attributes)


@contextlib.contextmanager
def current(span: Span) -> Iterator[None]:
    """``span`` is the current span within the block (spans started there nest under
    it); it does not end with the block."""
    otel = _process.otel
    if otel is None:
        yield
        return
    with otel.current(span):
        yield


def record(
    name: str,
    parent: TraceRef | None,
    start_ns: int,
    end_ns: int,
    attributes: Attributes | None = None,
    *,
    events: Sequence[Event] = (),
    ids: TraceRef | None = None,
    error: str | None = None,
    links: Sequence[TraceRef] = (),
) -> None:
    """Exports a span that is over already: its times come from the database (a task's
    wait, a rescued attempt, a finished run). ``ids``: the span's own fixed ids."""
    otel = _process.otel
    if otel is not None:
        otel.record(
            name, parent, start_ns, max(start_ns, end_ns), attributes, events, ids, error, links
        )


# --- where a trace is shown ------------------------------------------------------------

# The user's tracing UI: a URL template with {trace_id}, for `awp run get` and the console.
TRACE_URL_VARIABLE: Final = "AWP_TRACE_URL"


def trace_url_template(template: str) -> str:
    """The template, checked: an http(s) URL with {trace_id} in it."""
    if not template.startswith(("http://", "https://")) or "{trace_id}" not in template:
        raise ValueError(
            f"{TRACE_URL_VARIABLE} must be an http(s) URL with {{trace_id}} in it, got {template!r}"
        )
    return template


def trace_link(template: str | None, trace_id: str | None) -> str | None:
    """The trace's page in the user's tracing UI; None without a template or a trace."""
    if not template or not trace_id:
        return None
    return trace_url_template(template).replace("{trace_id}", trace_id)


def current_traceparent() -> str | None:
    """The current span's traceparent in this process, if the application traces (with
    its own OpenTelemetry setup or AWP's): what the SDK sends with StartRun. Costs one
    lookup when OpenTelemetry was never imported, so no caller can have a span."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


class TraceIds(logging.Filter):
    """Adds trace_id and span_id to a log record made inside a span (a structured field
    like run_id), so a log line leads to its trace and back."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace = sys.modules.get("opentelemetry.trace")
        if trace is not None:
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                record.trace_id = f"{context.trace_id:032x}"
                record.span_id = f"{context.span_id:016x}"
        return True
