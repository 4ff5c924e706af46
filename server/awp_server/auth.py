"""Bearer-token checks: the worker token for Register, the admin token for ControlService.

Other WorkerService calls are authenticated by their session; health and reflection
are open so that probes and grpcurl work.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from awp_kernel.errors import AwpError, ErrorKind
from awp_protocol.errors import Reason
from awp_server.errors import to_status

REGISTER = "/awp.v1.WorkerService/Register"
CONTROL_PREFIX = "/awp.v1.ControlService/"


def _bearer(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return ""


def _denied(
    handler: grpc.RpcMethodHandler[Any, Any], which: str
) -> grpc.RpcMethodHandler[Any, Any]:
    status = to_status(
        AwpError(
            ErrorKind.UNAUTHENTICATED,
            Reason.TOKEN_INVALID,
            f"missing or wrong {which} token (authorization: Bearer <token>)",
        )
    )

    async def deny_unary(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort_with_status(status)

    async def deny_stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort_with_status(status)
        yield  # pragma: no cover - marks this an async generator

    deserializer = handler.request_deserializer
    serializer = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny_unary, deserializer, serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny_stream, deserializer, serializer)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny_unary, deserializer, serializer)
    return grpc.stream_stream_rpc_method_handler(deny_stream, deserializer, serializer)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, worker_token: str, admin_token: str) -> None:
        self._worker_token = worker_token
        self._admin_token = admin_token

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if method == REGISTER:
            expected, which = self._worker_token, "worker"
        elif method.startswith(CONTROL_PREFIX):
            expected, which = self._admin_token, "admin"
        else:
            return handler
        presented = _bearer(handler_call_details.invocation_metadata)
        if handler is None or hmac.compare_digest(presented.encode(), expected.encode()):
            return handler
        return _denied(handler, which)
