"""The CLI's connection to awp-server's ControlService, and how its errors read.

Every failed call becomes a CliError: the server's ErrorInfo reason and message, its
BadRequest field violations one per line, or "cannot reach awp-server at ADDR" when
no server answered at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

import grpc

from awp.v1 import control_pb2_grpc
from awp_cli.errors import CliError, Exit
from awp_common import tls as tls_flags
from awp_common.flags import flag, positive_duration
from awp_protocol import errors
from awp_protocol.errors import Reason

DEFAULT_ADDRESS: Final = "127.0.0.1:50051"

# Codes that mean the request itself is wrong: the user can fix it and retry.
_USER_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
# Worth a reconnect while following a stream: the server or network hiccuped.
TRANSIENT_CODES: Final = frozenset(
    code for code in grpc.StatusCode if code.value[0] in errors.TRANSIENT_CODES
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


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to call; the `awp` settings (awp_common.flags)."""

    address: str = field(
        default=DEFAULT_ADDRESS,
        metadata=flag("--address", "AWP_ADDRESS", "awp-server HOST:PORT"),
    )
    token: str = field(
        default="",
        repr=False,
        metadata=flag(
            "--token", "AWP_TOKEN", "admin token, sent as 'authorization: Bearer'", secret=True
        ),
    )
    tls: bool = field(default=False, metadata=tls_flags.TLS)
    tls_ca_file: str | None = field(default=None, metadata=tls_flags.TLS_CA_FILE)
    tls_cert_file: str | None = field(default=None, metadata=tls_flags.TLS_CERT_FILE)
    tls_key_file: str | None = field(default=None, metadata=tls_flags.TLS_KEY_FILE)
    tls_server_name: str | None = field(default=None, metadata=tls_flags.TLS_SERVER_NAME)
    # Deadline of each unary call, seconds.
    timeout: float = field(
        default=30.0,
        metadata=flag(
            "--timeout", "AWP_TIMEOUT", "how long to wait for each answer", read=positive_duration
        ),
    )


@dataclass(frozen=True, slots=True)
class ServerError:
    """What a failed call's trailers say: google.rpc.ErrorInfo and BadRequest."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    violations: tuple[tuple[str, str], ...] = ()


def decode(error: grpc.aio.AioRpcError) -> ServerError:
    details = errors.decode_details(error.trailing_metadata())
    return ServerError(error.code(), error.details() or "", details.reason, details.violations)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def failure(error: grpc.aio.AioRpcError, address: str, tls_on: bool = False) -> CliError:
    """The CliError a failed call stands for (tls_on: whether the call went over TLS)."""
    decoded = decode(error)
    message = _one_line(decoded.message)
    if decoded.reason:
        hint = _HINTS.get(decoded.reason)
        code = Exit.USAGE if decoded.code in _USER_CODES else Exit.SERVER
        if decoded.violations:
            # The message only joins the violations, which are listed one per line below.
            count = len(decoded.violations)
            message = f"{count} invalid field{'s' if count > 1 else ''}"
        return CliError(
            code,
            f"{decoded.reason}: {message}",
            details=(f"hint: {hint}",) if hint else (),
            violations=decoded.violations,
            reason=decoded.reason,
        )
    # No ErrorInfo: the answer did not come from AWP's handlers (transport, proxy, crash).
    if decoded.code == grpc.StatusCode.UNAVAILABLE:
        reason = tls_flags.mismatch(decoded.message, tls_on) or message
        return CliError(Exit.SERVER, f"cannot reach awp-server at {address}: {reason}")
    if decoded.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(Exit.SERVER, f"awp-server at {address} did not answer in time")
    if decoded.code == grpc.StatusCode.UNIMPLEMENTED:
        return CliError(Exit.SERVER, f"{address} does not serve awp.v1.ControlService ({message})")
    code = Exit.USAGE if decoded.code in _USER_CODES else Exit.SERVER
    return CliError(code, f"{decoded.code.name}: {message}")


class Client:
    """One channel to awp-server; create it inside the running event loop."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._tls = tls_flags.client_tls(target)
        self._channel = tls_flags.channel(
            target.address,
            self._tls,
            [("grpc.max_receive_message_length", 64 * 1024 * 1024)],
        )
        self.control = control_pb2_grpc.ControlServiceStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {target.token}"),) if target.token else ()
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Req) -> Resp:
        """A unary call with the token and a deadline; failures raise CliError."""
        try:
            return await method(
                request,
                metadata=self._metadata,
                timeout=self.target.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise failure(error, self.target.address, self._tls.on) from None

    def stream(
        self, method: Callable[..., grpc.aio.UnaryStreamCall[Req, Resp]], request: Req
    ) -> grpc.aio.UnaryStreamCall[Req, Resp]:
        """A server stream with the token and no deadline: the caller decides when to stop,
        cancels the call when it does, and handles AioRpcError (to reconnect or not)."""
        return method(request, metadata=self._metadata)


async def iterate(call: grpc.aio.UnaryStreamCall[Req, Resp]) -> AsyncIterator[Resp]:
    """The messages of a stream, cancelling the call if the consumer stops early."""
    try:
        async for message in call:
            yield message
    finally:
        call.cancel()
