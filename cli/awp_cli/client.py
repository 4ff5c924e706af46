"""The CLI's connection to awp-server: the SDK's client, its failures told as CliError.

The settings (--address, --token, TLS, --timeout) are the SDK's Connection; an address
without a port means 50051. A failed call becomes a CliError: the server's ErrorInfo
reason and message, its BadRequest field violations one per line, or "cannot reach
awp-server at ADDR" and how to start one when no server answered at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import grpc

from awp.v1 import control_pb2_grpc
from awp_cli.errors import CliError, Exit
from awp_protocol.errors import Reason
from awp_sdk import errors
from awp_sdk.client import AsyncClient
from awp_sdk.connection import Connection

# The request itself is wrong: the user can fix it and retry.
_USER_ERRORS: Final = (
    errors.InvalidArgument,
    errors.NotFound,
    errors.Conflict,
    errors.FailedPrecondition,
    errors.Unauthenticated,
    errors.PermissionDenied,
)
# Hints for reasons whose fix is not obvious from the server's message alone.
_HINTS: Final[dict[str, str]] = {
    Reason.DEFINITION_CONFLICT: (
        "workflows are immutable: give the changed definition a new version"
    ),
    Reason.TOKEN_INVALID: "pass the admin token with --token or AWP_TOKEN",
}

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def cli_error(error: errors.AwpError) -> CliError:
    """The CliError an SDK error stands for."""
    code = Exit.USAGE if isinstance(error, _USER_ERRORS) else Exit.SERVER
    if not error.reason:
        # Not from AWP's handlers: the SDK's message already says what happened and where.
        return CliError(code, error.message)
    message = error.message
    if error.violations:
        # The message only joins the violations, which are listed one per line below.
        count = len(error.violations)
        message = f"{count} invalid field{'s' if count > 1 else ''}"
    hint = _HINTS.get(error.reason)
    return CliError(
        code,
        f"{error.reason}: {message}",
        details=(f"hint: {hint}",) if hint else (),
        violations=tuple(error.violations),
        reason=error.reason,
    )


class Client:
    """The SDK's AsyncClient for the CLI's commands; create it inside the running loop."""

    def __init__(self, target: Connection) -> None:
        self.target = target
        self.sdk = AsyncClient(connection=target)

    @property
    def control(self) -> control_pb2_grpc.ControlServiceAsyncStub:
        return self.sdk.control

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sdk.close()

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Req) -> Resp:
        """A unary call with the token and a deadline; failures raise CliError."""
        try:
            return await self.sdk.call(method, request)
        except errors.AwpError as error:
            raise cli_error(error) from None

    def stream(
        self, method: Callable[..., grpc.aio.UnaryStreamCall[Req, Resp]], request: Req
    ) -> grpc.aio.UnaryStreamCall[Req, Resp]:
        """A server stream with the token and no deadline (see awp_sdk.connection)."""
        return self.sdk.stream(method, request)
