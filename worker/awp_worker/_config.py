"""The worker's configuration: one dataclass, filled from flags or AWP_* variables."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from awp_protocol.limits import MAX_RESULTS_PER_COMPLETE, MAX_WORKER_NAME_CHARS
from awp_protocol.names import check_register

# The flag each RegisterRequest field comes from, for start-up errors.
REGISTER_FLAGS = {
    "name": "--name",
    "executor_kinds": "--kinds",
    "max_concurrency": "--concurrency",
    "labels": "--label",
}


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"[:MAX_WORKER_NAME_CHARS]


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a WorkerRuntime needs. Defaults follow DESIGN.md §9."""

    server: str = "127.0.0.1:50051"
    # The cluster's worker token (never logged, never in repr).
    token: str = field(default="", repr=False)
    name: str = field(default_factory=default_name)
    kinds: tuple[str, ...] = ("mock", "python")
    concurrency: int = 8
    modules: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    shutdown_timeout: float = 30.0
    safety_margin: float = 1.0
    metrics_port: int = 0  # 0: no metrics endpoint
    metrics_host: str = "127.0.0.1"
    log_format: str = "json"
    log_level: str = "INFO"
    tls: bool = False
    tls_ca_file: str | None = None
    # Claim long poll and its backoff on empty answers or errors.
    claim_wait: float = 10.0
    claim_backoff_initial: float = 0.25
    claim_backoff_max: float = 5.0
    # Result coalescing: flush when this many are ready or after this long.
    flush_size: int = 16
    flush_interval: float = 0.002
    # Deadline of unary calls (Register, Complete, Drain); Claim adds claim_wait.
    rpc_timeout: float = 10.0
    # Heartbeat stream reconnects: first retry within ~50 ms, capped here.
    reconnect_initial: float = 0.05
    reconnect_max: float = 2.0

    def __post_init__(self) -> None:
        if not self.server:
            raise ValueError("server address is empty")
        # Refuse at start-up what the server's Register would refuse.
        check_register(
            self.name, self.kinds, self.concurrency, self.labels, settings=REGISTER_FLAGS
        )
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown timeout must be >= 0")
        if self.safety_margin < 0:
            raise ValueError("safety margin must be >= 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port must be 0 to 65535, got {self.metrics_port}")
        if self.log_format not in ("json", "text"):
            raise ValueError(f"log format must be json or text, got {self.log_format!r}")
        if self.claim_wait < 0 or self.claim_backoff_initial <= 0:
            raise ValueError("claim wait must be >= 0 and the claim backoff > 0")
        if self.claim_backoff_max < self.claim_backoff_initial:
            raise ValueError("claim backoff maximum must be >= its initial delay")
        if not 1 <= self.flush_size <= MAX_RESULTS_PER_COMPLETE or self.flush_interval < 0:
            raise ValueError(
                f"flush size must be 1 to {MAX_RESULTS_PER_COMPLETE} (results per Complete) "
                "and the flush interval >= 0"
            )
        if self.rpc_timeout <= 0:
            raise ValueError("rpc timeout must be > 0")


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _labels(values: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in values:
        for pair in _split(item):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"label {pair!r} is not key=value")
            labels[key.strip()] = value.strip()
    return labels


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def env_default(name: str, default: str) -> str:
        return env.get(name, default)

    parser = argparse.ArgumentParser(
        prog="awp-worker",
        description=(
            "Run AWP tasks: register with an awp-server, claim leases up to the free "
            "slots, execute them, report fenced results; SIGTERM drains."
        ),
        epilog="Every flag also reads an AWP_* environment variable (named in its help).",
    )
    add = parser.add_argument
    add(
        "--server",
        default=env_default("AWP_SERVER", "127.0.0.1:50051"),
        help="awp-server address host:port (AWP_SERVER)",
    )
    add(
        "--token",
        default=env_default("AWP_WORKER_TOKEN", ""),
        help="cluster worker token, sent as 'authorization: Bearer' (AWP_WORKER_TOKEN)",
    )
    add(
        "--name",
        default=env_default("AWP_WORKER_NAME", ""),
        help="worker name, default <hostname>-<pid> (AWP_WORKER_NAME)",
    )
    add(
        "--kinds",
        default=env_default("AWP_WORKER_KINDS", "mock,python"),
        help="comma-separated executor kinds: mock, python (AWP_WORKER_KINDS)",
    )
    add(
        "--concurrency",
        default=env_default("AWP_WORKER_CONCURRENCY", "8"),
        help="leases held at once, 1 to 1000 (AWP_WORKER_CONCURRENCY)",
    )
    add(
        "--module",
        action="append",
        default=None,
        help="module(s) to import that register @action functions; repeat or "
        "comma-separate (AWP_WORKER_MODULE)",
    )
    add(
        "--label",
        action="append",
        default=None,
        help="key=value label reported at registration; repeatable (AWP_WORKER_LABELS)",
    )
    add(
        "--shutdown-timeout",
        default=env_default("AWP_WORKER_SHUTDOWN_TIMEOUT", "30"),
        help="seconds a drain waits for running leases (AWP_WORKER_SHUTDOWN_TIMEOUT)",
    )
    add(
        "--safety-margin",
        default=env_default("AWP_WORKER_SAFETY_MARGIN", "1.0"),
        help="seconds before a lease could expire at which its work is cancelled "
        "(AWP_WORKER_SAFETY_MARGIN)",
    )
    add(
        "--claim-wait",
        default=env_default("AWP_WORKER_CLAIM_WAIT", "10"),
        help="seconds a Claim long-polls (AWP_WORKER_CLAIM_WAIT)",
    )
    add(
        "--metrics-port",
        default=env_default("AWP_WORKER_METRICS_PORT", "0"),
        help="Prometheus /metrics port on 127.0.0.1; 0 = off (AWP_WORKER_METRICS_PORT)",
    )
    add(
        "--log-format",
        choices=["json", "text"],
        default=env_default("AWP_LOG_FORMAT", "json"),
        help="json lines or text (AWP_LOG_FORMAT)",
    )
    add(
        "--log-level",
        default=env_default("AWP_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING, ERROR (AWP_LOG_LEVEL)",
    )
    add(
        "--tls",
        action="store_true",
        default=env.get("AWP_TLS", "") in ("1", "true", "yes"),
        help="connect with TLS (AWP_TLS=1)",
    )
    add(
        "--tls-ca",
        default=env.get("AWP_TLS_CA") or None,
        help="PEM file of the CA to trust instead of the system roots (AWP_TLS_CA)",
    )
    return parser


def parse_config(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerConfig:
    """Flags win over environment variables; exits with a usage error on bad values."""
    environ = os.environ if env is None else env
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    modules_raw = args.module if args.module is not None else [environ.get("AWP_WORKER_MODULE", "")]
    labels_raw = args.label if args.label is not None else [environ.get("AWP_WORKER_LABELS", "")]
    try:
        return WorkerConfig(
            server=args.server,
            token=args.token,
            name=args.name or default_name(),
            kinds=_split(args.kinds),
            concurrency=int(args.concurrency),
            modules=tuple(m for raw in modules_raw for m in _split(raw)),
            labels=_labels(labels_raw),
            shutdown_timeout=float(args.shutdown_timeout),
            safety_margin=float(args.safety_margin),
            claim_wait=float(args.claim_wait),
            metrics_port=int(args.metrics_port),
            log_format=args.log_format,
            log_level=str(args.log_level).upper(),
            tls=bool(args.tls or args.tls_ca),
            tls_ca_file=args.tls_ca,
        )
    except ValueError as exc:
        parser.error(str(exc))
