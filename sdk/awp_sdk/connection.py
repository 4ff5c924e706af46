"""Where and how a client calls awp-server: the address, the token, TLS, the deadline;
and the one gRPC channel every call goes through.

The settings are one dataclass (``Connection``) whose fields carry their flag and
AWP_* variable, so the `awp` CLI takes them as flags and the SDK reads them from the
environment the same way: ``Connection.from_env()``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, TypeVar

import grpc

from awp.v1 import control_pb2_grpc
from awp_common import flags, tracing
from awp_common import tls as tls_flags
from awp_common.flags import flag, positive_duration
from awp_sdk.errors import from_rpc_error

# awp-server's default listen port (DESIGN.md §9): an address without one means it.
DEFAULT_PORT: Final = 50051
DEFAULT_ADDRESS: Final = f"127.0.0.1:{DEFAULT_PORT}"
# gRPC target schemes (dns:///host, unix:/path...): such an address is taken as written.
_SCHEME: Final = re.compile(r"(dns|unix|unix-abstract|ipv4|ipv6|vsock):")
# Answers can be large (a run with 10,000 tasks and their outputs).
_RECEIVE_BYTES: Final = 64 * 1024 * 1024

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def server_address(text: str) -> str:
    """HOST:PORT as given, or HOST with the default port; ValueError when it is neither.

    gRPC itself dials 443 for a bare host name, which is never where awp-server listens.
    """
    address = text.strip()
    if _SCHEME.match(address):
        return address
    if address.startswith("["):  # [IPv6] or [IPv6]:PORT
        host, _, rest = address.partition("]")
        if rest == "":
            return f"{host}]:{DEFAULT_PORT}"
        if rest.startswith(":") and rest[1:].isdigit():
            return address
        raise ValueError(f"expected HOST[:PORT], got {text!r}")
    if address.count(":") > 1:  # a bare IPv6 address
        return f"[{address}]:{DEFAULT_PORT}"
    host, sep, port = address.partition(":")
    if not host or (sep and not port.isdigit()):
        raise ValueError(f"expected HOST[:PORT], got {text!r}")
    return address if sep else f"{host}:{DEFAULT_PORT}"


@dataclass(frozen=True, slots=True)
class Connection:
    """Where and how to call awp-server. Every field is also a flag of `awp` and an AWP_*
    variable (``from_env``); the token can come from a file (AWP_TOKEN_FILE)."""

    address: str = field(
        default=DEFAULT_ADDRESS,
        metadata=flag(
            "--address",
            "AWP_ADDRESS",
            f"awp-server HOST[:PORT] (port {DEFAULT_PORT} when left out)",
        ),
    )
    token: str = field(
        default="",
        repr=False,
        metadata=flag(
            "--token", "AWP_TOKEN", "token, sent as 'authorization: Bearer'", secret=True
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", server_address(self.address))
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {self.timeout}")
        self.client_tls  # noqa: B018 (raises on a certificate without its key)

    @property
    def client_tls(self) -> tls_flags.ClientTls:
        return tls_flags.client_tls(self)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> Connection:
        """The AWP_* variables (os.environ by default), overridden by the fields given that
        are not None; ``token_file`` reads the token from a file. ValueError names a bad
        value and where it came from."""
        token_file = given.pop("token_file", None)
        parser = _Parser(add_help=False)
        flags.add_flags(parser, cls)
        from_env = flags.settings(cls, parser, parser.parse_args([]), environ)
        chosen = {name: value for name, value in given.items() if value is not None}
        if token_file is not None:
            chosen["token"] = flags.read_secret_file(token_file, "token_file")
        return dataclasses.replace(from_env, **chosen)


class _Parser(argparse.ArgumentParser):
    """A library raises where a command line would exit."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


class Channel:
    """One gRPC channel to awp-server with the token on every call; create it inside the
    running event loop. Failed calls raise the typed errors of awp_sdk.errors."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._tls = connection.client_tls
        self._channel = tls_flags.channel(
            connection.address, self._tls, [("grpc.max_receive_message_length", _RECEIVE_BYTES)]
        )
        self.control = control_pb2_grpc.ControlServiceStub(self._channel)
        self._metadata = _credential(connection.token)
        # False for a channel shared from another (as_caller): its owner closes it.
        self._owned = True

    def as_caller(self, connection: Connection) -> Channel:
        """The same gRPC channel, calling with `connection`'s token (a server holds one
        connection for many callers, as the console does for its sessions)."""
        caller = copy.copy(self)
        caller.connection = connection
        caller._metadata = _credential(connection.token)
        caller._owned = False
        return caller

    async def close(self) -> None:
        if self._owned:
            await self._channel.close()

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Req) -> Resp:
        """A unary call with the token and the connection's deadline, and the caller's
        trace context when it traces (StartRun stores it: the run's trace continues it)."""
        metadata = self._metadata
        traceparent = tracing.current_traceparent()
        if traceparent is not None:
            metadata = (*metadata, (tracing.TRACEPARENT, traceparent))
        try:
            return await method(request, metadata=metadata, timeout=self.connection.timeout)
        except grpc.aio.AioRpcError as error:
            raise self.error(error) from None

    def stream(
        self, method: Callable[..., grpc.aio.UnaryStreamCall[Req, Resp]], request: Req
    ) -> grpc.aio.UnaryStreamCall[Req, Resp]:
        """A server stream with the token and no deadline: the caller decides when to stop,
        cancels the call when it does, and handles AioRpcError (to reconnect or not)."""
        return method(request, metadata=self._metadata)

    def error(self, error: grpc.aio.AioRpcError) -> Exception:
        return from_rpc_error(error, self.connection.address, self._tls.on)


def _credential(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def iterate(call: grpc.aio.UnaryStreamCall[Req, Resp]) -> AsyncIterator[Resp]:
    """The messages of a stream, cancelling the call if the consumer stops early."""
    try:
        async for message in call:
            yield message
    finally:
        call.cancel()
