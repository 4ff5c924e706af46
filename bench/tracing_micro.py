"""What the worker's spans cost by themselves, in one process (docs/performance.md,
"Tracing"): CPU per attempt of the span calls the worker makes (awp_worker._tracing, the
OpenTelemetry SDK's span creation) and of encoding them for OTLP (what the exporter's
thread does before its gRPC call), and the encoding's cost per span, attribute and event.
Steadier than bench.py's ``tracing`` scenario on a shared machine: it times one process's
CPU, best of five.

    .venv/bin/python bench/tracing_micro.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from awp_common import tracing
from awp_worker import _tracing

RUN = tracing.TraceRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
ATTEMPTS = 2000
BATCH = 512  # the SDK's default export batch


def _kept() -> InMemorySpanExporter:
    """This process traces; its spans are kept in memory instead of exported."""
    assert tracing.configure("awp-tracing-micro", {"OTEL_TRACES_EXPORTER": "console"})
    otel = tracing._process.otel
    assert otel is not None
    kept = InMemorySpanExporter()
    otel.provider._active_span_processor._span_processors = (SimpleSpanProcessor(kept),)
    return kept


def _attempt() -> None:
    """One attempt's spans, as the worker makes them (a mock action, accepted)."""
    lease = SimpleNamespace(
        traceparent=RUN.traceparent,
        run_id="0" * 36,
        task_key="t001",
        attempt=1,
        fencing_token=1234,
        dispatch_id=55,
        action="mock",
    )
    held: Any = SimpleNamespace(
        lease=lease,
        span=None,
        outcome="succeeded",
        cancel_reason=None,
        stream=None,
        span_ends_on_release=False,
    )
    with _tracing.attempt(held, "1" * 36, lambda: True), _tracing.action(held):
        pass
    _tracing.completed(held, "accepted")
    _tracing.released(held)


def _encode_us(spans: tuple[ReadableSpan, ...], per: int) -> float:
    started = time.process_time()
    for i in range(0, len(spans), BATCH):
        encode_spans(spans[i : i + BATCH]).SerializeToString()
    return 1e6 * (time.process_time() - started) / per


def _best(measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    runs = [measure() for _ in range(5)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def main() -> None:
    kept = _kept()
    for _ in range(300):  # warm up
        _attempt()

    def attempts() -> tuple[float, float]:
        kept.clear()
        started = time.process_time()
        for _ in range(ATTEMPTS):
            _attempt()
        spans_us = 1e6 * (time.process_time() - started) / ATTEMPTS
        return spans_us, _encode_us(kept.get_finished_spans(), ATTEMPTS)

    spans_us, encode_us = _best(attempts)
    print(f"per attempt: spans {spans_us:.1f} us, OTLP encoding {encode_us:.1f} us")
    for attributes, event in ((0, False), (1, False), (9, False), (9, True)):

        def shaped(n: int = attributes, with_event: bool = event) -> tuple[float, float]:
            kept.clear()
            for _ in range(BATCH):
                span = tracing.start(tracing.ATTEMPT_SPAN, RUN, {f"a{i}": i for i in range(n)})
                assert span is not None
                if with_event:
                    span.add_event("e", {"k": "v"})
                span.end()
            return 0.0, _encode_us(kept.get_finished_spans(), BATCH)

        _, per_span = _best(shaped)
        print(f"encoding a span of {attributes} attributes, event {event}: {per_span:.1f} us")
    tracing.shutdown()


if __name__ == "__main__":
    main()
