"""Mapping domain and storage errors to gRPC statuses with machine-readable details.

Every error a client sees carries a google.rpc.ErrorInfo (domain "awp.dev") whose
reason is one of awp.v1.ErrorReason, and bad input a google.rpc.BadRequest naming each
field; awp_protocol.errors writes that google.rpc.Status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import asyncpg
import grpc
from google.rpc import code_pb2
from grpc_status import rpc_status

from awp_db.connect import TIMEOUT_ERRORS, ended_by_server
from awp_kernel.errors import AwpError, database_unavailable, invalid_many
from awp_protocol.errors import FieldsInvalid, encode_status

log = logging.getLogger("awp.server.errors")

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
    # A lock, statement or idle-in-transaction timeout: rolled back, worth retrying.
    *TIMEOUT_ERRORS,
)


def to_status(error: AwpError) -> grpc.Status:
    code = code_pb2.Code.Value(error.kind.name)
    status: grpc.Status = rpc_status.to_status(
        encode_status(code, error.message, error.reason, error.metadata, error.violations)
    )
    return status


def as_awp_error(exc: BaseException) -> AwpError | None:
    """The AwpError an exception stands for, or None when it is a bug."""
    if isinstance(exc, AwpError):
        return exc
    if isinstance(exc, FieldsInvalid):
        return invalid_many(exc.violations, exc.reason)
    if isinstance(exc, DATABASE_DOWN) or ended_by_server(exc):
        return database_unavailable(type(exc).__name__)
    return None


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    error = as_awp_error(exc)
    if error is None:
        log.exception("unexpected error in handler", exc_info=exc)
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
