"""The checks every request passes before any handler sees it, for every RPC.

grpc.aio decodes a request before the handler runs, and answers a decode failure with
UNKNOWN and no details. This interceptor gives every method a deserializer that never
raises: bytes that do not decode, or a request over MAX_REQUEST_BYTES, become a refusal
the handler's wrapper sends as INVALID_ARGUMENT with an ErrorInfo (MALFORMED_REQUEST,
REQUEST_TOO_LARGE) and a BadRequest naming the field. A decoded request of AWP's own is
then checked generically (awp_protocol.wire: text, counts, durations) before its handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf import descriptor

from awp.v1 import control_pb2
from awp_kernel.errors import AwpError, invalid_many
from awp_protocol.errors import Reason
from awp_protocol.limits import MAX_REQUEST_BYTES
from awp_protocol.wire import request_violations, too_large, undecodable
from awp_server.errors import to_status

Context = grpc.aio.ServicerContext[Any, Any]
# Quoted: grpc's handler type is generic only to the type checker.
Continuation = Callable[
    [grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]
]
# A bad workflow definition is refused as INVALID_DEFINITION, whichever check finds it.
_DEFINITION_REQUESTS = frozenset({control_pb2.CreateWorkflowRequest.DESCRIPTOR.full_name})


class _Refused:
    """What the deserializer hands on instead of a request it could not decode."""

    __slots__ = ("error",)

    def __init__(self, error: AwpError) -> None:
        self.error = error


def _request_type(deserializer: Any) -> descriptor.Descriptor | None:
    # Generated handlers deserialise with the request class's FromString.
    found = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return found if isinstance(found, descriptor.Descriptor) else None


def _guarded(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    message_type = _request_type(deserializer)

    def deserialize(data: bytes) -> Any:
        if len(data) > MAX_REQUEST_BYTES:
            violation = too_large(message_type, data)
            return _Refused(invalid_many([violation], Reason.REQUEST_TOO_LARGE))
        try:
            request = deserializer(data)
        except Exception:
            violation = undecodable(message_type, data)
            return _Refused(invalid_many([violation], Reason.MALFORMED_REQUEST))
        if message_type is None or not message_type.full_name.startswith("awp.v1."):
            return request
        violations = request_violations(request)
        if violations:
            reason = (
                Reason.INVALID_DEFINITION
                if message_type.full_name in _DEFINITION_REQUESTS
                else Reason.INVALID_ARGUMENT
            )
            return _Refused(invalid_many(violations, reason))
        return request

    return deserialize


async def _refuse(request: Any, context: Context) -> None:
    if isinstance(request, _Refused):
        await context.abort_with_status(to_status(request.error))


class RequestGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        deserializer = _guarded(handler.request_deserializer)
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            unary = cast(Callable[[Any, Context], Awaitable[Any]], handler.unary_unary)

            async def checked_unary(request: Any, context: Context) -> Any:
                await _refuse(request, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(checked_unary, deserializer, serializer)
        # grpc's stubs type these handlers as sync; under grpc.aio they are async generators.
        if handler.unary_stream is not None:
            server_stream = cast(Callable[[Any, Context], AsyncIterator[Any]], handler.unary_stream)

            async def checked_server_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                await _refuse(request, context)
                async for item in server_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                checked_server_stream, deserializer, serializer
            )
        if handler.stream_stream is not None:
            bidi = cast(Callable[[Any, Context], AsyncIterator[Any]], handler.stream_stream)

            async def checked_bidi(requests: Any, context: Context) -> AsyncIterator[Any]:
                async def checked() -> AsyncIterator[Any]:
                    async for request in requests:
                        await _refuse(request, context)
                        yield request

                async for item in bidi(checked(), context):
                    yield item

            return grpc.stream_stream_rpc_method_handler(checked_bidi, deserializer, serializer)
        return handler  # no client-streaming RPC exists
