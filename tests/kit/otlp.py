"""A real OTLP/gRPC trace receiver, built on the OTLP protobuf definitions of the
opentelemetry-proto package (no collector binary is installable here): it accepts the
ExportTraceServiceRequest every OpenTelemetry SDK's OTLP exporter sends, and keeps the
spans, flattened, for a test or a benchmark to read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from awp_common.processes import free_port


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    error: bool


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests += 1
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope in resource_spans.scope_spans:
                self.spans.extend(_flat(service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> Iterator[ReceivedSpan]:
        return (span for span in self.spans if span.name == name)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]


def _flat(service: str, span: Any) -> ReceivedSpan:
    return ReceivedSpan(
        service=service,
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_attributes(span.attributes),
        events=[(event.name, _attributes(event.attributes)) for event in span.events],
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        # STATUS_CODE_ERROR
        error=span.status.code == 2,
    )


class OtlpReceiver:
    """The receiver served on a free loopback port (`endpoint` for OTEL_EXPORTER_OTLP_*)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.receiver = Receiver()
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.receiver, self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process needs to export its spans here, quickly (100 ms batches)."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }

    async def __aenter__(self) -> Receiver:
        await self._server.start()
        return self.receiver

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(grace=None)
