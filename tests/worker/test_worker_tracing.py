"""The worker's spans (docs/observability.md) against the scriptable WorkerService, with
the process's tracing on and its spans kept in memory: an attempt's span is the run's
child and ends once its lease is let go, with Complete's answer as an attribute or the revocation
as an event; the action's span is the attempt's child; an untraced run gets no span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from runtime_harness import start
from worker_fakes import FakeServer

from awp_common import tracing
from awp_worker._lifecycle import EXIT_OK
from kit import poll_until as eventually

RUN = tracing.TraceRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process traces (printing its batches nowhere), its spans kept in memory."""
    assert tracing.configure("awp-worker-test", {"OTEL_TRACES_EXPORTER": "console"})
    kept = InMemorySpanExporter()
    otel = tracing._process.otel
    assert otel is not None
    otel.provider.add_span_processor(SimpleSpanProcessor(kept))
    yield kept
    tracing.shutdown()


def named(kept: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in kept.get_finished_spans() if s.name == name]


async def test_a_completed_attempt_s_span_ends_with_complete_s_answer(
    fake: FakeServer, spans: InMemorySpanExporter
) -> None:
    task = await fake.service.add("noop", traceparent=RUN.traceparent)
    worker = start(fake)
    await eventually(lambda: named(spans, tracing.ATTEMPT_SPAN))
    assert await worker.stop() == EXIT_OK
    assert task.dispatch_id in fake.service.results()
    (attempt,) = named(spans, tracing.ATTEMPT_SPAN)
    (code,) = named(spans, tracing.ACTION_SPAN)
    assert attempt.parent is not None and attempt.context is not None
    assert (f"{attempt.parent.trace_id:032x}", f"{attempt.parent.span_id:016x}") == (
        RUN.trace_id,
        RUN.span_id,
    )
    assert code.parent is not None and code.parent.span_id == attempt.context.span_id
    assert attempt.attributes is not None
    assert attempt.attributes[tracing.OUTCOME] == "succeeded"
    assert attempt.attributes[tracing.FENCING_TOKEN] == 1000 + task.dispatch_id
    assert attempt.attributes[tracing.COMPLETE_OUTCOME] == "accepted"
    assert list(attempt.events) == []  # the span ends at the answer: no event repeats it


async def test_a_revoked_attempt_s_span_says_so_and_ends(
    fake: FakeServer, spans: InMemorySpanExporter
) -> None:
    task = await fake.service.add("slow", {"sleep_ms": 30_000}, traceparent=RUN.traceparent)
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    fake.service.revoke(task)
    await eventually(lambda: named(spans, tracing.ATTEMPT_SPAN))
    assert await worker.stop() == EXIT_OK
    (attempt,) = named(spans, tracing.ATTEMPT_SPAN)
    assert attempt.attributes is not None
    assert attempt.attributes[tracing.OUTCOME] == "cancelled"
    assert attempt.attributes["awp.cancel_reason"] == "revoked"
    assert [e.name for e in attempt.events] == [tracing.REVOKED_EVENT]


async def test_an_untraced_run_gets_no_span(fake: FakeServer, spans: InMemorySpanExporter) -> None:
    task = await fake.service.add("noop")
    worker = start(fake)
    await eventually(lambda: task.dispatch_id in fake.service.results())
    assert await worker.stop() == EXIT_OK
    assert spans.get_finished_spans() == ()


def test_a_step_span_is_made_only_inside_a_traced_attempt(spans: InMemorySpanExporter) -> None:
    """A step of an untraced run (no span current) begins no trace of its own; inside a
    traced attempt it is the current span's child."""
    with tracing.child(tracing.STEP_SPAN) as outside:
        assert outside is None
    attempt = tracing.start(tracing.ATTEMPT_SPAN, RUN)
    assert attempt is not None
    with (
        tracing.current(attempt),
        tracing.child(tracing.STEP_SPAN, {tracing.STEP_NAME: "draft"}) as inside,
    ):
        assert inside is not None
    attempt.end()
    (step,) = named(spans, tracing.STEP_SPAN)
    assert step.parent is not None
    assert step.parent.span_id == attempt.get_span_context().span_id
    assert step.attributes is not None and step.attributes[tracing.STEP_NAME] == "draft"
