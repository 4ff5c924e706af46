"""awp_common.tracing's rules without a process: when the OTEL_* variables turn tracing
on, which traceparent a run continues, the tracing UI's link; and that tracing off
imports nothing of OpenTelemetry (the base install has none)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from awp_common import tracing
from awp_common.tracing import RunTrace, TraceRef

HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_the_standard_variables_turn_tracing_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.requested(environ) is on


def test_a_sampled_traceparent_is_continued() -> None:
    caller = TraceRef.parse(HEADER)
    assert caller == TraceRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert caller.traceparent == HEADER
    trace = RunTrace.begin(caller)
    assert trace is not None
    assert trace.run.trace_id == caller.trace_id and trace.caller_span == caller.span_id
    assert trace.run.span_id != caller.span_id and len(trace.run.span_id) == 16


@pytest.mark.parametrize(
    "header",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # not sampled
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # unknown version
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "garbage",
    ],
)
def test_anything_else_starts_no_trace_of_the_callers(header: str) -> None:
    assert TraceRef.parse(header) is None
    # Tracing is off in this process: the run is not traced at all.
    assert RunTrace.of_caller(header) is None


def test_a_caller_that_does_not_sample_leaves_the_run_untraced() -> None:
    assert RunTrace.of_caller(HEADER) is not None
    assert RunTrace.of_caller(HEADER[:-2] + "00") is None
    assert RunTrace.of_caller(None) is None  # and this process does not trace


def test_the_tracing_ui_link() -> None:
    template = "http://jaeger:16686/trace/{trace_id}"
    assert tracing.trace_link(template, "abc") == "http://jaeger:16686/trace/abc"
    assert tracing.trace_link(None, "abc") is None
    assert tracing.trace_link(template, None) is None
    for bad in ("jaeger/trace/{trace_id}", "http://jaeger/trace/"):
        with pytest.raises(ValueError, match="AWP_TRACE_URL must be an http"):
            tracing.trace_url_template(bad)


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys; from awp_common import tracing, logs; logs.setup('json');"
        "assert not tracing.configure('x', {});"
        "import logging; logging.getLogger('t').info('line');"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("ratio", "traced"), [("0", False), ("1", True)])
def test_a_run_the_server_begins_is_traced_as_its_sampler_says(ratio: str, traced: bool) -> None:
    code = (
        "from awp_common import tracing; assert tracing.configure('x');"
        "print(tracing.RunTrace.of_caller(None) is not None); tracing.shutdown()"
    )
    environ = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": ratio,
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ
    ).stdout
    assert out.strip() == str(traced)
