"""awp-server settings: every one a flag and an AWP_* environment variable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from awp_common import flags, logs
from awp_common.flags import flag, is_loopback
from awp_common.tls import ServerTls
from awp_db import settings
from awp_db.connect import PoolMode, SessionLimits
from awp_protocol.limits import MAX_STREAM_READERS_PER_SERVER


@dataclass(frozen=True, slots=True)
class ServerConfig:
    database_url: str = field(repr=False, metadata=flags.DATABASE_URL)
    session_database_url: str = field(
        default="", repr=False, metadata=settings.SESSION_DATABASE_URL
    )
    database_pool_mode: PoolMode = field(
        default=PoolMode.SESSION, metadata=settings.DATABASE_POOL_MODE
    )
    no_migrate: bool = field(default=False, metadata=settings.NO_MIGRATE)
    listen: str = field(
        default="127.0.0.1:50051",
        metadata=flag("--listen", "AWP_LISTEN", "gRPC HOST:PORT", read=flags.address),
    )
    metrics_listen: str | None = field(
        default="127.0.0.1:9464", metadata=flags.metrics_listen("AWP_METRICS_LISTEN")
    )
    # Kubernetes' gRPC probes speak neither TLS nor tokens: they get a port of their own
    # that serves grpc.health.v1 alone, so --listen can stay TLS-only.
    health_listen: str | None = field(
        default=None,
        metadata=flag(
            "--health-listen",
            "AWP_HEALTH_LISTEN",
            "plaintext HOST:PORT serving only grpc.health.v1 (for probes), or 'off'",
            read=flags.address_or_off,
            shown="off",
        ),
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
    credentials_file: str | None = field(
        default=None,
        metadata=flag(
            "--credentials-file",
            "AWP_CREDENTIALS_FILE",
            "YAML/JSON file of named credentials with roles (docs/security.md)",
        ),
    )
    tls_cert_file: str | None = field(
        default=None,
        metadata=flag(
            "--tls-cert-file", "AWP_TLS_CERT_FILE", "PEM certificate: serve gRPC over TLS"
        ),
    )
    tls_key_file: str | None = field(
        default=None,
        metadata=flag("--tls-key-file", "AWP_TLS_KEY_FILE", "PEM private key of --tls-cert-file"),
    )
    tls_client_ca_file: str | None = field(
        default=None,
        metadata=flag(
            "--tls-client-ca-file",
            "AWP_TLS_CLIENT_CA_FILE",
            "PEM CA: require client certificates it signed (mutual TLS)",
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
    # Off only to compare or to rule it out: the coordinator's passes then grant alone.
    no_claim_grants: bool = field(
        default=False,
        metadata=flag(
            "--no-claim-grants",
            "AWP_NO_CLAIM_GRANTS",
            "a Claim whose slots find no offer does not grant ready tasks itself",
            switch=True,
        ),
    )
    pool_size: int = field(
        default=20,
        metadata=flag("--pool-size", "AWP_POOL_SIZE", "database connections", read=flags.whole(1)),
    )
    max_stream_readers: int = field(
        default=MAX_STREAM_READERS_PER_SERVER,
        metadata=flag(
            "--max-stream-readers",
            "AWP_MAX_STREAM_READERS",
            "open WatchStream calls this server serves at once (STREAM_LIMIT beyond)",
            read=flags.whole(1, MAX_STREAM_READERS_PER_SERVER),
        ),
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
    def tls(self) -> ServerTls | None:
        if not (self.tls_cert_file and self.tls_key_file):
            return None
        return ServerTls(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file or None)

    @property
    def session_url(self) -> str:
        """Where LISTEN and migrations connect: a session of their own."""
        return self.session_database_url or self.database_url

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
        description=(
            "The AWP gRPC server: workers' WorkerService and clients' ControlService. "
            "`awp-server migrate` applies the database migrations as a step of its own "
            "(awp-server migrate --help)."
        ),
        check=_check,
    )


@dataclass(frozen=True, slots=True)
class MigrateConfig:
    """awp-server migrate: the database settings alone, read from the same flags and
    variables as the server's (one environment serves both)."""

    database_url: str = field(repr=False, metadata=flags.DATABASE_URL)
    session_database_url: str = field(
        default="", repr=False, metadata=settings.SESSION_DATABASE_URL
    )
    give_up_after_s: float = field(
        default=120.0,
        metadata=flag(
            "--give-up-after",
            "AWP_MIGRATE_GIVE_UP_AFTER",
            "how long to wait for PostgreSQL to answer before failing",
            read=flags.positive_duration,
        ),
    )
    log_format: str = field(default=logs.DEFAULT_FORMAT, metadata=flags.LOG_FORMAT)
    log_level: str = field(default=logs.DEFAULT_LEVEL, metadata=flags.LOG_LEVEL)

    @property
    def session_url(self) -> str:
        return self.session_database_url or self.database_url


def parse_migrate(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> MigrateConfig:
    return flags.parse(
        MigrateConfig,
        argv,
        environ=environ,
        prog="awp-server migrate",
        description=(
            "Applies the database migrations this build has and the database lacks, one "
            "transaction each, then exits: 0 when the schema is up to date. Over "
            "--session-database-url when given (migrations take a session advisory lock)."
        ),
    )


def _check(config: ServerConfig) -> None:
    """What production refuses (tests build looser configs directly)."""
    _check_credentials(config)
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if config.tls_client_ca_file and not config.tls_cert_file:
        raise ValueError(
            "--tls-client-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file"
        )
    if not config.insecure and config.tls is None and not is_loopback(config.listen):
        raise ValueError(
            f"refusing to serve plaintext on {config.listen}, beyond this machine: give "
            "--tls-cert-file and --tls-key-file, or pass --insecure"
        )
    if config.lease_ttl_s <= config.heartbeat_interval_s:
        raise ValueError("--lease-ttl must be longer than --heartbeat-interval")
    settings.check_urls(config.database_url, config.session_database_url, config.database_pool_mode)


def _check_credentials(config: ServerConfig) -> None:
    """Without a credentials file, both tokens: a server with only one of them would start
    and then refuse every call of the other role, found only at that first call. A file
    is read (and reloaded on SIGHUP) by the credential store, which checks it then."""
    if config.insecure or config.credentials_file:
        return
    missing = [
        name
        for name, token in (
            ("--worker-token", config.worker_token),
            ("--admin-token", config.admin_token),
        )
        if not token
    ]
    if missing:
        raise ValueError(
            f"refusing to start without {' and '.join(missing)}: give both tokens (AWP_* "
            "variables, or their _FILE variants) or --credentials-file; pass --insecure "
            "for local development"
        )
