"""Mapping domain and storage errors to gRPC statuses with machine-readable details.

Every error a client sees carries a google.rpc.ErrorInfo (domain "awp.dev") whose
reason is stable, and bad input a google.rpc.BadRequest naming each field.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import asyncpg
import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from awp_kernel.definition import DefinitionInvalid
from awp_kernel.errors import AwpError, ErrorKind, database_unavailable, invalid_many

log = logging.getLogger("awp.server.errors")

ERROR_DOMAIN: Final = "awp.dev"

_CODES: Final[dict[ErrorKind, tuple[grpc.StatusCode, int]]] = {
    ErrorKind.INVALID_ARGUMENT: (grpc.StatusCode.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT),
    ErrorKind.NOT_FOUND: (grpc.StatusCode.NOT_FOUND, code_pb2.NOT_FOUND),
    ErrorKind.ALREADY_EXISTS: (grpc.StatusCode.ALREADY_EXISTS, code_pb2.ALREADY_EXISTS),
    ErrorKind.FAILED_PRECONDITION: (
        grpc.StatusCode.FAILED_PRECONDITION,
        code_pb2.FAILED_PRECONDITION,
    ),
    ErrorKind.UNAUTHENTICATED: (grpc.StatusCode.UNAUTHENTICATED, code_pb2.UNAUTHENTICATED),
    ErrorKind.PERMISSION_DENIED: (grpc.StatusCode.PERMISSION_DENIED, code_pb2.PERMISSION_DENIED),
    ErrorKind.UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE),
    ErrorKind.RESOURCE_EXHAUSTED: (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        code_pb2.RESOURCE_EXHAUSTED,
    ),
}

# Storage failures that mean "the database is unreachable", not "the request is bad".
DATABASE_DOWN: Final = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    TimeoutError,
)


def to_status(error: AwpError) -> grpc.Status:
    _, code = _CODES[error.kind]
    info = error_details_pb2.ErrorInfo(
        reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata
    )
    details = [info]
    if error.violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in error.violations
                ]
            )
        )
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    status: grpc.Status = rpc_status.to_status(
        status_pb2.Status(code=code, message=error.message, details=packed)
    )
    return status


def as_awp_error(exc: BaseException) -> AwpError | None:
    """The AwpError an exception stands for, or None when it is a bug."""
    if isinstance(exc, AwpError):
        return exc
    if isinstance(exc, DefinitionInvalid):
        return invalid_many(exc.violations, "INVALID_DEFINITION")
    if isinstance(exc, DATABASE_DOWN):
        return database_unavailable(type(exc).__name__)
    return None


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    error = as_awp_error(exc)
    if error is None:
        log.exception("unexpected error in handler", exc_info=exc)
        error = AwpError(ErrorKind.UNAVAILABLE, "INTERNAL", "internal error; see server logs")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see server logs")
    await context.abort_with_status(to_status(error))


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self_ = TypeVar("Self_")


def unary(
    handler: Callable[[Self_, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Self_, Req, grpc.aio.ServicerContext[Req, Resp]], Awaitable[Resp]]:
    """Turns AwpError, invalid definitions and database outages into rich statuses."""

    @functools.wraps(handler)
    async def wrapper(
        self: Self_, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
    ) -> Resp:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await abort(context, exc)
            raise  # abort raises; this satisfies the type checker

    return wrapper


def server_stream(
    handler: Callable[[Self_, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]],
) -> Callable[[Self_, Req, grpc.aio.ServicerContext[Req, Resp]], AsyncIterator[Resp]]:
    @functools.wraps(handler)
    async def wrapper(
        self: Self_, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
    ) -> AsyncIterator[Resp]:
        try:
            async for item in handler(self, request, context):
                yield item
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await abort(context, exc)
            raise

    return wrapper
