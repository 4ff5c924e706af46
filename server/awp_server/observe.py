"""Per-RPC metrics for every service: calls by method and status code, and latency.

An interceptor rather than code in each handler, so ControlService, WorkerService,
health and reflection are all measured the same way.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc

from awp_server import metrics


def _code(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "OK" if code in (None, 0) else str(code)


def _record(method: str, context: grpc.aio.ServicerContext[Any, Any], started: float) -> None:
    metrics.RPC_LATENCY.labels(method).observe(time.perf_counter() - started)
    metrics.RPCS.labels(method, _code(context)).inc()


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            inner = cast(
                Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]],
                handler.unary_unary,
            )

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                started = time.perf_counter()
                try:
                    return await inner(request, context)
                finally:
                    _record(method, context, started)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is None and handler.stream_stream is None:
            return handler
        # grpc's stubs type these handlers as sync; under grpc.aio they are async generators.
        streaming = cast(
            Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]],
            handler.unary_stream or handler.stream_stream,
        )

        async def stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for item in streaming(request, context):
                    yield item
            finally:
                _record(method, context, started)

        factory = (
            grpc.unary_stream_rpc_method_handler
            if handler.unary_stream is not None
            else grpc.stream_stream_rpc_method_handler
        )
        return factory(stream, handler.request_deserializer, handler.response_serializer)
