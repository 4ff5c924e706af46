"""The OpenTelemetry SDK behind awp_common.tracing, imported only once tracing is on
(the ``otel`` extra; the base install has none of it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
)

if TYPE_CHECKING:
    from awp_common.tracing import Attributes, Event, TraceRef

# The ids the next span takes (see _FixedIds): the run's span, exported after the fact.
_fixed_ids: ContextVar[TraceRef | None] = ContextVar("awp_fixed_span_ids", default=None)


class _FixedIds(RandomIdGenerator):
    """Random ids, except for a span whose ids were fixed beforehand (a run's)."""

    def generate_span_id(self) -> int:
        fixed = _fixed_ids.get()
        return int(fixed.span_id, 16) if fixed is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        fixed = _fixed_ids.get()
        return int(fixed.trace_id, 16) if fixed is not None else super().generate_trace_id()


def _remote(ref: TraceRef) -> SpanContext:
    return SpanContext(
        int(ref.trace_id, 16),
        int(ref.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def _context(parent: TraceRef | None) -> Context | None:
    return None if parent is None else trace.set_span_in_context(NonRecordingSpan(_remote(parent)))


class Otel:
    """The process's tracer provider, exporting in batches in the background."""

    def __init__(self, service_name: str, environ: Mapping[str, str]) -> None:
        # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, which win.
        attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
        self.provider = TracerProvider(
            resource=Resource.create(attributes), id_generator=_FixedIds()
        )
        exporter: SpanExporter
        if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
            exporter = ConsoleSpanExporter()
        else:
            # Reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _INSECURE, _CERTIFICATE...
            exporter = OTLPSpanExporter()
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        # The global provider too, so the actions' own instrumentation exports alike.
        trace.set_tracer_provider(self.provider)
        self.tracer = self.provider.get_tracer("awp")

    def sampled(self, trace_id: str, name: str) -> bool:
        """Whether the process's sampler keeps a new trace (a run's, begun here)."""
        decision = self.provider.sampler.should_sample(None, int(trace_id, 16), name)
        return decision.decision is Decision.RECORD_AND_SAMPLE

    def shutdown(self) -> None:
        self.provider.shutdown()

    @contextlib.contextmanager
    def span(
        self, name: str, parent: TraceRef | None, attributes: Attributes | None
    ) -> Iterator[Span]:
        with self.tracer.start_as_current_span(
            name, context=_context(parent), attributes=attributes
        ) as current:
            yield current

    def in_span(self) -> bool:
        """Whether the current span (of this task or thread) records."""
        return trace.get_current_span().is_recording()

    def start(self, name: str, parent: TraceRef | None, attributes: Attributes | None) -> Span:
        return self.tracer.start_span(name, context=_context(parent), attributes=attributes)

    @contextlib.contextmanager
    def current(self, span: Span) -> Iterator[None]:
        with trace.use_span(span, end_on_exit=False):
            yield

    def record(
        self,
        name: str,
        parent: TraceRef | None,
        start_ns: int,
        end_ns: int,
        attributes: Attributes | None,
        events: Sequence[Event],
        ids: TraceRef | None,
        error: str | None,
        links: Sequence[TraceRef],
    ) -> None:
        token = _fixed_ids.set(ids)
        try:
            done = self.tracer.start_span(
                name,
                context=_context(parent),
                attributes=attributes,
                start_time=start_ns,
                links=[Link(_remote(link)) for link in links],
            )
        finally:
            _fixed_ids.reset(token)
        for event in events:
            done.add_event(event.name, event.attributes, timestamp=event.at_ns)
        if error is not None:
            done.set_status(Status(StatusCode.ERROR, error))
        done.end(end_time=end_ns)
