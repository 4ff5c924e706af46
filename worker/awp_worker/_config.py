"""The worker's configuration: one dataclass, filled from flags or AWP_* variables."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from awp_common import flags, logs
from awp_common import tls as tls_flags
from awp_common.flags import flag
from awp_protocol.limits import (
    MAX_CLAIM_WAIT_MS,
    MAX_RESULTS_PER_COMPLETE,
    MAX_WORKER_NAME_CHARS,
)
from awp_protocol.names import check_register
from awp_sdk.connection import DEFAULT_ADDRESS, DEFAULT_PORT, server_address

# The flag each RegisterRequest field comes from, for start-up errors.
REGISTER_FLAGS = {
    "name": "--name",
    "executor_kinds": "--kinds",
    "max_concurrency": "--concurrency",
    "labels": "--label",
    "models": "--model",
    "resources": "--resource",
}


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"[:MAX_WORKER_NAME_CHARS]


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"label {pair!r} is not key=value")
        if labels.get(key, value) != value:
            # One value per label key; a worker's several models are --model's.
            raise ValueError(
                f"label key {key!r} is given twice ({labels[key]!r}, {value!r}); "
                "advertise several models with --model"
            )
        labels[key] = value
    return labels


def _resources(pairs: tuple[str, ...]) -> dict[str, int]:
    resources: dict[str, int] = {}
    for pair in pairs:
        name, sep, units = pair.partition("=")
        name, units = name.strip(), units.strip()
        if not sep or not name or not units.isdigit():
            raise ValueError(f"resource {pair!r} is not name=units (e.g. gpu=2)")
        if name in resources:
            raise ValueError(f"resource {name!r} is given twice")
        resources[name] = int(units)
    return resources


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a WorkerRuntime needs. Defaults follow DESIGN.md §9."""

    # One address, or several comma-separated (Session: moved along when one is away).
    server: str = field(
        default=DEFAULT_ADDRESS,
        metadata=flag(
            "--server",
            "AWP_SERVER",
            f"awp-server address HOST[:PORT] (port {DEFAULT_PORT} when left out), or several "
            "comma-separated: when one is unreachable (even mid-drain) the worker moves "
            "to the next",
        ),
    )
    # The cluster's worker token (never logged, never in repr): the server's
    # --worker-token, under the same flag and variable, so one environment serves both.
    worker_token: str = field(
        default="",
        repr=False,
        metadata=flag(
            "--worker-token",
            "AWP_WORKER_TOKEN",
            "cluster worker token, sent as 'authorization: Bearer'",
            secret=True,
        ),
    )
    name: str = field(
        default_factory=default_name,
        metadata=flag("--name", "AWP_WORKER_NAME", "worker name", shown="<hostname>-<pid>"),
    )
    kinds: tuple[str, ...] = field(
        default=("mock", "python"),
        metadata=flag(
            "--kinds",
            "AWP_WORKER_KINDS",
            "comma-separated executor kinds: mock, python",
            read=flags.items,
        ),
    )
    concurrency: int = field(
        default=8,
        metadata=flag(
            "--concurrency",
            "AWP_WORKER_CONCURRENCY",
            "leases held at once, 1 to 1000",
            read=flags.integer,
        ),
    )
    modules: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "--module",
            "AWP_WORKER_MODULE",
            "module(s) to import that register @action functions; repeat or comma-separate",
            read=tuple,
            repeat=True,
        ),
    )
    labels: Mapping[str, str] = field(
        default_factory=dict,
        metadata=flag(
            "--label",
            "AWP_WORKER_LABELS",
            "key=value label reported at registration, which tasks may require or prefer; "
            "one value per key; repeat or comma-separate",
            read=_labels,
            repeat=True,
        ),
    )
    # Placement (docs/workflows.md "Placement"): each model is advertised as the label
    # model=<name>, and each resource's capacity bounds what its leases reserve.
    models: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "--model",
            "AWP_WORKER_MODELS",
            "a model loaded here, advertised as the label model=<name>; repeat or comma-separate",
            read=tuple,
            repeat=True,
        ),
    )
    resources: Mapping[str, int] = field(
        default_factory=dict,
        metadata=flag(
            "--resource",
            "AWP_WORKER_RESOURCES",
            "name=units: a countable resource and its capacity (e.g. gpu=2); repeat or "
            "comma-separate",
            read=_resources,
            repeat=True,
        ),
    )
    # The server's --shutdown-grace for its calls; a worker's own variable, since a
    # drain waits for tasks, far longer than calls take.
    shutdown_grace: float = field(
        default=30.0,
        metadata=flag(
            "--shutdown-grace",
            "AWP_WORKER_SHUTDOWN_GRACE",
            "how long a drain on SIGTERM waits for running leases",
            read=flags.duration,
        ),
    )
    safety_margin: float = field(
        default=1.0,
        metadata=flag(
            "--safety-margin",
            "AWP_WORKER_SAFETY_MARGIN",
            "how long before a lease could expire its work is cancelled",
            read=flags.duration,
        ),
    )
    # Off by default: several workers often share one machine.
    metrics_listen: str | None = field(
        default=None,
        metadata=flags.metrics_listen("AWP_WORKER_METRICS_LISTEN", shown="off"),
    )
    log_format: str = field(default=logs.DEFAULT_FORMAT, metadata=flags.LOG_FORMAT)
    log_level: str = field(default=logs.DEFAULT_LEVEL, metadata=flags.LOG_LEVEL)
    tls: bool = field(default=False, metadata=tls_flags.TLS)
    tls_ca_file: str | None = field(default=None, metadata=tls_flags.TLS_CA_FILE)
    tls_cert_file: str | None = field(default=None, metadata=tls_flags.TLS_CERT_FILE)
    tls_key_file: str | None = field(default=None, metadata=tls_flags.TLS_KEY_FILE)
    tls_server_name: str | None = field(default=None, metadata=tls_flags.TLS_SERVER_NAME)
    # Claim long poll and its backoff on empty answers or errors.
    claim_wait: float = field(
        default=10.0,
        metadata=flag(
            "--claim-wait",
            "AWP_WORKER_CLAIM_WAIT",
            "how long a Claim long-polls",
            read=flags.duration,
        ),
    )
    claim_backoff_initial: float = field(
        default=0.25,
        metadata=flag(
            "--claim-backoff-initial",
            "AWP_WORKER_CLAIM_BACKOFF_INITIAL",
            "first wait after an empty or failed Claim; doubles (with jitter) up to the max",
            read=flags.duration,
        ),
    )
    claim_backoff_max: float = field(
        default=5.0,
        metadata=flag(
            "--claim-backoff-max",
            "AWP_WORKER_CLAIM_BACKOFF_MAX",
            "longest wait between Claims that find nothing or fail",
            read=flags.duration,
        ),
    )
    # Result coalescing: flush when this many are ready or after this long.
    flush_size: int = field(
        default=16,
        metadata=flag(
            "--flush-size",
            "AWP_WORKER_FLUSH_SIZE",
            "results sent in one Complete at most, 1 to 500",
            read=flags.integer,
        ),
    )
    flush_interval: float = field(
        default=0.002,
        metadata=flag(
            "--flush-interval",
            "AWP_WORKER_FLUSH_INTERVAL",
            "how long a ready result waits for others to share its Complete",
            read=flags.duration,
        ),
    )
    # The worker before round 3, kept for A/B measurement (docs/performance.md, "Round 3").
    claim_separately: bool = field(
        default=False,
        metadata=flag(
            "--claim-separately",
            "AWP_WORKER_CLAIM_SEPARATELY",
            "Completes only report results; freed slots wait for a separate Claim",
            switch=True,
        ),
    )
    # Deadline of unary calls (Register, Complete, Drain); Claim adds claim_wait.
    rpc_timeout: float = field(
        default=10.0,
        metadata=flag(
            "--rpc-timeout",
            "AWP_WORKER_RPC_TIMEOUT",
            "deadline of Register, Complete and Drain calls (a Claim's adds --claim-wait)",
            read=flags.duration,
        ),
    )
    # Heartbeat stream reconnects: first retry within ~50 ms, capped here.
    reconnect_initial: float = field(
        default=0.05,
        metadata=flag(
            "--reconnect-initial",
            "AWP_WORKER_RECONNECT_INITIAL",
            "first wait before reopening a broken heartbeat stream; doubles up to the max",
            read=flags.positive_duration,
        ),
    )
    reconnect_max: float = field(
        default=2.0,
        metadata=flag(
            "--reconnect-max",
            "AWP_WORKER_RECONNECT_MAX",
            "longest wait before reopening a broken heartbeat stream "
            "(never longer than the heartbeat interval)",
            read=flags.positive_duration,
        ),
    )

    @property
    def client_tls(self) -> tls_flags.ClientTls:
        return tls_flags.client_tls(self)

    @property
    def servers(self) -> tuple[str, ...]:
        """The server addresses, in the order they are tried, each with its port (the
        default one when left out, as the CLI and the SDK dial it)."""
        return tuple(server_address(item) for item in flags.items(self.server))

    def __post_init__(self) -> None:
        self.client_tls  # noqa: B018 (raises on a certificate without its key)
        try:
            self.servers  # noqa: B018 (raises on an address that is not HOST[:PORT])
        except ValueError as exc:
            raise ValueError(f"server address: {exc}") from None
        if not self.servers:
            raise ValueError("server address is empty")
        if len(set(self.servers)) != len(self.servers):
            raise ValueError(f"server address listed twice in {self.server!r}")
        # Refuse at start-up what the server's Register would refuse.
        check_register(
            self.name,
            self.kinds,
            self.concurrency,
            self.labels,
            models=self.models,
            resources=self.resources,
            settings=REGISTER_FLAGS,
        )
        if self.shutdown_grace < 0:
            raise ValueError("shutdown grace must be >= 0")
        if self.safety_margin < 0:
            raise ValueError("safety margin must be >= 0")
        if self.log_format not in logs.FORMATS:
            raise ValueError(f"log format must be json or text, got {self.log_format!r}")
        if not 0 <= self.claim_wait * 1000 <= MAX_CLAIM_WAIT_MS or self.claim_backoff_initial <= 0:
            raise ValueError(
                f"claim wait must be 0 to {MAX_CLAIM_WAIT_MS // 1000} s and the claim backoff > 0"
            )
        if self.claim_backoff_max < self.claim_backoff_initial:
            raise ValueError("claim backoff maximum must be >= its initial delay")
        if not 1 <= self.flush_size <= MAX_RESULTS_PER_COMPLETE or self.flush_interval < 0:
            raise ValueError(
                f"flush size must be 1 to {MAX_RESULTS_PER_COMPLETE} (results per Complete) "
                "and the flush interval >= 0"
            )
        if self.rpc_timeout <= 0:
            raise ValueError("rpc timeout must be > 0")


def parse_config(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerConfig:
    """Flags win over environment variables; exits with a usage error on bad values."""
    config = flags.parse(
        WorkerConfig,
        argv,
        environ=env,
        prog="awp-worker",
        description=(
            "Run AWP tasks: register with an awp-server, claim leases up to the free "
            "slots, execute them, report fenced results; SIGTERM drains."
        ),
    )
    return replace(config, tls=True) if config.client_tls.on and not config.tls else config
