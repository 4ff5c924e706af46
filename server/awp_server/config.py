"""awp-server settings: every one a flag and an AWP_* environment variable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from awp_common import flags, logs
from awp_common.flags import flag
from awp_db.connect import SessionLimits


@dataclass(frozen=True, slots=True)
class ServerConfig:
    database_url: str = field(metadata=flags.DATABASE_URL)
    listen: str = field(
        default="127.0.0.1:50051",
        metadata=flag("--listen", "AWP_LISTEN", "gRPC HOST:PORT", read=flags.address),
    )
    metrics_listen: str | None = field(
        default="127.0.0.1:9464", metadata=flags.metrics_listen("AWP_METRICS_LISTEN")
    )
    worker_token: str = field(
        default="",
        repr=False,
        metadata=flag(
            "--worker-token", "AWP_WORKER_TOKEN", "token workers present at Register", secret=True
        ),
    )
    admin_token: str = field(
        default="",
        repr=False,
        metadata=flag(
            "--admin-token", "AWP_ADMIN_TOKEN", "token ControlService callers present", secret=True
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=flag(
            "--insecure",
            "AWP_INSECURE",
            "allow running without tokens (development only)",
            switch=True,
        ),
    )
    lease_ttl_s: float = field(
        default=15.0,
        metadata=flag(
            "--lease-ttl",
            "AWP_LEASE_TTL",
            "how long a lease lives without a renewal",
            read=flags.positive_duration,
        ),
    )
    # Workers learn it at Register; the coordinator reads it from each session's row.
    heartbeat_interval_s: float = field(
        default=5.0,
        metadata=flag(
            "--heartbeat-interval",
            "AWP_HEARTBEAT_INTERVAL",
            "how often workers heartbeat (the coordinator counts silence in these)",
            read=flags.positive_duration,
        ),
    )
    stream_grace_s: float = field(
        default=1.0,
        metadata=flag(
            "--stream-grace",
            "AWP_STREAM_GRACE",
            "how long a broken heartbeat stream's leases survive",
            read=flags.positive_duration,
        ),
    )
    claim_max_wait_s: float = field(
        default=30.0,
        metadata=flag(
            "--claim-max-wait",
            "AWP_CLAIM_MAX_WAIT",
            "cap on a Claim long poll",
            read=flags.positive_duration,
        ),
    )
    pool_size: int = field(
        default=20,
        metadata=flag("--pool-size", "AWP_POOL_SIZE", "database connections", read=flags.whole(1)),
    )
    health_check_interval_s: float = field(
        default=1.0,
        metadata=flag(
            "--health-check-interval",
            "AWP_HEALTH_CHECK_INTERVAL",
            "how often gRPC health checks the database",
            read=flags.positive_duration,
        ),
    )
    shutdown_grace_s: float = field(
        default=5.0,
        metadata=flag(
            "--shutdown-grace",
            "AWP_SHUTDOWN_GRACE",
            "how long in-flight calls may take to finish on SIGTERM",
            read=flags.positive_duration,
        ),
    )
    # How long a stalled process may hold row locks before PostgreSQL drops its session;
    # every database timeout follows from it (awp_db.connect.SessionLimits).
    db_stall_timeout_s: float | None = field(
        default=None,
        metadata=flags.db_stall_timeout(shown="a fifth of --lease-ttl, within 1s-5s"),
    )
    log_format: str = field(default=logs.DEFAULT_FORMAT, metadata=flags.LOG_FORMAT)
    log_level: str = field(default=logs.DEFAULT_LEVEL, metadata=flags.LOG_LEVEL)

    @property
    def session_limits(self) -> SessionLimits:
        if self.db_stall_timeout_s is not None:
            return SessionLimits(self.db_stall_timeout_s)
        return SessionLimits.for_lease_ttl(self.lease_ttl_s)

    @property
    def lease_ttl_ms(self) -> int:
        return int(self.lease_ttl_s * 1000)

    @property
    def heartbeat_interval_ms(self) -> int:
        return round(self.heartbeat_interval_s * 1000)

    @property
    def stream_grace_ms(self) -> int:
        return int(self.stream_grace_s * 1000)


def parse(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    return flags.parse(
        ServerConfig,
        argv,
        environ=environ,
        prog="awp-server",
        description="The AWP gRPC server: workers' WorkerService and clients' ControlService.",
        check=_check,
    )


def _check(config: ServerConfig) -> None:
    """What production refuses (tests build looser configs directly)."""
    if not config.insecure and not (config.worker_token and config.admin_token):
        raise ValueError(
            "refusing to start without --worker-token and --admin-token "
            "(AWP_WORKER_TOKEN / AWP_ADMIN_TOKEN, or their _FILE variants); "
            "pass --insecure for local development"
        )
    if config.lease_ttl_s <= config.heartbeat_interval_s:
        raise ValueError("--lease-ttl must be longer than --heartbeat-interval")
