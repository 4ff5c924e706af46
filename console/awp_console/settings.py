"""`awp console`'s settings: where to serve, which awp-server to call and how, where the
processes' metrics are (awp_common.flags: every one a flag and an AWP_* variable).

The server-side flags have the names and variables of every AWP client's (`--address`,
`--tls-*`, `--timeout`), so one environment serves the CLI and the console alike.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from awp_common import flags, tracing
from awp_common import tls as tls_flags
from awp_common.flags import flag
from awp_sdk.connection import DEFAULT_ADDRESS, DEFAULT_PORT, server_address

DEFAULT_LISTEN: Final = "127.0.0.1:8080"


def _urls(given: tuple[str, ...]) -> tuple[str, ...]:
    for url in given:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise argparse.ArgumentTypeError(f"expected an http(s) URL, got {url!r}")
    return given


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = field(
        default=DEFAULT_LISTEN,
        metadata=flag(
            "--listen", "AWP_CONSOLE_LISTEN", "the console's HTTP HOST:PORT", read=flags.address
        ),
    )
    # The SDK's, as for `awp`: one default, and a HOST alone means HOST:DEFAULT_PORT.
    address: str = field(
        default=DEFAULT_ADDRESS,
        metadata=flag(
            "--address",
            "AWP_ADDRESS",
            f"awp-server HOST[:PORT] (port {DEFAULT_PORT} when left out)",
            read=server_address,
        ),
    )
    tls: bool = field(default=False, metadata=tls_flags.TLS)
    tls_ca_file: str | None = field(default=None, metadata=tls_flags.TLS_CA_FILE)
    tls_cert_file: str | None = field(default=None, metadata=tls_flags.TLS_CERT_FILE)
    tls_key_file: str | None = field(default=None, metadata=tls_flags.TLS_KEY_FILE)
    tls_server_name: str | None = field(default=None, metadata=tls_flags.TLS_SERVER_NAME)
    timeout: float = field(
        default=30.0,
        metadata=flag(
            "--timeout",
            "AWP_TIMEOUT",
            "how long to wait for each answer of awp-server",
            read=flags.positive_duration,
        ),
    )
    metrics_urls: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "--metrics-url",
            "AWP_CONSOLE_METRICS_URLS",
            "Prometheus URL (http://HOST:PORT/metrics) of an awp-server or awp-coordinator "
            "whose figures the overview shows; repeatable, or comma-separated",
            read=_urls,
            repeat=True,
        ),
    )
    https_cert_file: str | None = field(
        default=None,
        metadata=flag(
            "--https-cert-file", "AWP_CONSOLE_HTTPS_CERT_FILE", "PEM certificate: serve HTTPS"
        ),
    )
    https_key_file: str | None = field(
        default=None,
        metadata=flag(
            "--https-key-file", "AWP_CONSOLE_HTTPS_KEY_FILE", "PEM private key of --https-cert-file"
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=flag(
            "--insecure",
            "AWP_CONSOLE_INSECURE",
            "allow plain HTTP on an address other machines can reach (tokens would cross "
            "the network in clear)",
            switch=True,
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "--allowed-hosts",
            "AWP_CONSOLE_ALLOWED_HOSTS",
            "host names browsers may reach the console by (the Host header); default: "
            "the --listen host, and the loopback names when it is loopback",
            repeat=True,
        ),
    )
    session_idle_s: float = field(
        default=8 * 3600.0,
        metadata=flag(
            "--session-idle-timeout",
            "AWP_CONSOLE_SESSION_IDLE_TIMEOUT",
            "a signed-in browser unused this long must sign in again",
            read=flags.positive_duration,
        ),
    )
    # The user's tracing UI: the run page links the run's trace there.
    trace_url: str | None = field(
        default=None,
        metadata=flag(
            "--trace-url",
            tracing.TRACE_URL_VARIABLE,
            "URL of a trace in your tracing UI, with {trace_id} where its id goes "
            "(e.g. http://jaeger:16686/trace/{trace_id}): a run's page links its trace",
            read=tracing.trace_url_template,
        ),
    )

    log_format: str = field(default="json", metadata=flags.LOG_FORMAT)
    log_level: str = field(default="info", metadata=flags.LOG_LEVEL)

    def __post_init__(self) -> None:
        if bool(self.https_cert_file) != bool(self.https_key_file):
            raise ValueError("--https-cert-file and --https-key-file go together")
        if not (self.https or self.insecure or flags.is_loopback(self.listen)):
            raise ValueError(
                f"--listen {self.listen} is reachable from other machines: serve HTTPS "
                "(--https-cert-file, --https-key-file) or accept plain HTTP with --insecure"
            )

    @property
    def https(self) -> bool:
        return bool(self.https_cert_file)

    def hosts(self) -> list[str]:
        """The Host names the console answers to: a page of another site that resolves
        its own name to this address (DNS rebinding) is refused."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        host, _ = flags.host_port(self.listen)
        if host in ("0.0.0.0", "::"):
            return ["*"]
        if flags.is_loopback(self.listen):
            return sorted({host, "127.0.0.1", "localhost", "::1", "[::1]"})
        return [host]
