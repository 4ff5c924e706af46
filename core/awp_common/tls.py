"""TLS for every gRPC hop: the server's listener and every client's channel.

Certificates are PEM files. The server re-reads its files when they change (cert-manager
rotates them in place): gRPC asks for the current configuration at each new handshake,
so established connections and their streams are untouched by a rotation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import grpc

from awp_common.flags import flag

log = logging.getLogger("awp.tls")

# The client side's settings, declared once for the worker, the CLI and the SDK.
TLS_CA_FILE: Final = flag(
    "--tls-ca-file",
    "AWP_TLS_CA_FILE",
    "PEM file of the CA that signed the server's certificate (turns TLS on)",
)
TLS_CERT_FILE: Final = flag(
    "--tls-cert-file", "AWP_TLS_CERT_FILE", "PEM certificate to present (mutual TLS)"
)
TLS_KEY_FILE: Final = flag(
    "--tls-key-file", "AWP_TLS_KEY_FILE", "PEM private key of --tls-cert-file"
)
TLS_SERVER_NAME: Final = flag(
    "--tls-server-name",
    "AWP_TLS_SERVER_NAME",
    "name the server's certificate must carry, when it is not the address's host",
)
TLS: Final = flag("--tls", "AWP_TLS", "connect with TLS, trusting the system's CAs", switch=True)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client connects: plaintext unless `enabled`."""

    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("--tls-cert-file and --tls-key-file go together")

    @property
    def on(self) -> bool:
        return self.enabled or bool(self.ca_file or self.cert_file or self.server_name)


class ClientTlsSettings(Protocol):
    """A settings dataclass with the five client TLS fields above."""

    @property
    def tls(self) -> bool: ...
    @property
    def tls_ca_file(self) -> str | None: ...
    @property
    def tls_cert_file(self) -> str | None: ...
    @property
    def tls_key_file(self) -> str | None: ...
    @property
    def tls_server_name(self) -> str | None: ...


def client_tls(settings: ClientTlsSettings) -> ClientTls:
    return ClientTls(
        settings.tls,
        settings.tls_ca_file or None,
        settings.tls_cert_file or None,
        settings.tls_key_file or None,
        settings.tls_server_name or None,
    )


def channel(
    address: str, tls: ClientTls, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """A channel to `address`, over TLS when asked; OSError when a PEM file is unreadable."""
    opts = list(options)
    if not tls.on:
        return grpc.aio.insecure_channel(address, options=opts)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file),
        private_key=_read(tls.key_file),
        certificate_chain=_read(tls.cert_file),
    )
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts)


# How gRPC words a connection the two ends disagree about: a TLS client meeting a
# plaintext server fails its handshake; a plaintext client meeting a TLS server sees the
# connection closed at once.
_HANDSHAKE_FAILED: Final = "handshake failed"
_CLOSED_AT_ONCE: Final = "socket closed"


def mismatch(details: str, tls_on: bool) -> str | None:
    """What an UNAVAILABLE call's details say about TLS on the two ends, in one line
    that names the flags to fix; None when they say nothing about it."""
    text = details.lower()
    if tls_on and _HANDSHAKE_FAILED in text:
        return (
            "the TLS handshake failed: the server does not speak TLS, or its certificate is "
            "not signed by --tls-ca-file or not for this name (--tls-server-name)"
        )
    if not tls_on and _CLOSED_AT_ONCE in text:
        return (
            "the server closed the connection at once: if it serves TLS, connect with "
            "--tls-ca-file (or --tls)"
        )
    return None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


# ---------------------------------------------------------------- the server's side


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert_file: str
    key_file: str
    # Set: mutual TLS, a client certificate signed by this CA is required.
    client_ca_file: str | None = None

    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials whose certificates follow their files: read at start (errors raise),
    then again at the first handshake after any of the files changed. A rotation caught
    half-written (unreadable or mismatched) keeps the previous certificates and logs it;
    the next handshake tries again."""
    seen = _stamp(tls)

    def configuration() -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())],
            root_certificates=_read(tls.client_ca_file),
        )

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        nonlocal seen
        stamp = _stamp(tls)
        if stamp == seen:
            return None
        try:
            fresh = configuration()
        except OSError as exc:
            log.warning("TLS files changed but cannot be read yet: %s", exc)
            return None
        seen = stamp
        log.info("TLS certificates re-read", extra={"files": ",".join(tls.files())})
        return fresh

    return grpc.dynamic_ssl_server_credentials(
        configuration(),
        fetch,  # type: ignore[arg-type]  # gRPC documents None as "keep the current one"
        require_client_authentication=tls.client_ca_file is not None,
    )


def _stamp(tls: ServerTls) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for name in tls.files():
        try:
            info = os.stat(name)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((info.st_mtime_ns, info.st_size, info.st_ino))
    return tuple(stamps)
