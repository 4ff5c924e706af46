"""awp-server settings: every one a flag and an AWP_* environment variable."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from awp_common.flags import EnvArgumentParser, host_port, positive_float


@dataclass(frozen=True, slots=True)
class ServerConfig:
    database_url: str
    listen: str = "127.0.0.1:50051"
    metrics_listen: str | None = "127.0.0.1:9464"
    worker_token: str = ""
    admin_token: str = ""
    insecure: bool = False
    lease_ttl_s: float = 15.0
    heartbeat_interval_s: float = 5.0
    stream_grace_s: float = 1.0
    claim_max_wait_s: float = 30.0
    pool_size: int = 20
    health_check_interval_s: float = 1.0
    shutdown_grace_s: float = 5.0
    log_format: str = "json"

    @property
    def lease_ttl_ms(self) -> int:
        return int(self.lease_ttl_s * 1000)

    @property
    def stream_grace_ms(self) -> int:
        return int(self.stream_grace_s * 1000)


def parse(argv: Sequence[str] | None = None) -> ServerConfig:
    parser = EnvArgumentParser(prog="awp-server", description="The AWP gRPC server.")
    parser.add("--database-url", env="AWP_DATABASE_URL", help="PostgreSQL URL")
    parser.add("--listen", env="AWP_LISTEN", default="127.0.0.1:50051", help="gRPC HOST:PORT")
    parser.add(
        "--metrics-listen",
        env="AWP_METRICS_LISTEN",
        default="127.0.0.1:9464",
        help="Prometheus HOST:PORT, or 'off'",
    )
    parser.add("--worker-token", env="AWP_WORKER_TOKEN", default="", help="token for Register")
    parser.add("--admin-token", env="AWP_ADMIN_TOKEN", default="", help="token for ControlService")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow running without tokens (development only)",
    )
    parser.add("--lease-ttl", env="AWP_LEASE_TTL", default=15.0, type=positive_float, help="s")
    parser.add(
        "--heartbeat-interval",
        env="AWP_HEARTBEAT_INTERVAL",
        default=5.0,
        type=positive_float,
        help="seconds between worker heartbeats",
    )
    parser.add(
        "--stream-grace",
        env="AWP_STREAM_GRACE",
        default=1.0,
        type=positive_float,
        help="seconds a broken heartbeat stream's leases survive",
    )
    parser.add(
        "--claim-max-wait",
        env="AWP_CLAIM_MAX_WAIT",
        default=30.0,
        type=positive_float,
        help="cap on a Claim long poll, s",
    )
    parser.add("--pool-size", env="AWP_POOL_SIZE", default=20, type=int, help="DB connections")
    parser.add(
        "--shutdown-grace",
        env="AWP_SHUTDOWN_GRACE",
        default=5.0,
        type=positive_float,
        help="seconds in-flight calls may take to finish on SIGTERM",
    )
    parser.add("--log-format", env="AWP_LOG_FORMAT", default="json", choices=["json", "text"])
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or AWP_DATABASE_URL) is required")
    insecure = bool(args.insecure) or _env_flag("AWP_INSECURE")
    if not insecure and not (args.worker_token and args.admin_token):
        parser.error(
            "refusing to start without --worker-token and --admin-token "
            "(AWP_WORKER_TOKEN / AWP_ADMIN_TOKEN); pass --insecure for local development"
        )
    if args.lease_ttl <= args.heartbeat_interval:
        parser.error("--lease-ttl must be longer than --heartbeat-interval")
    host_port(args.listen)
    metrics = None if args.metrics_listen in ("", "off") else args.metrics_listen
    if metrics is not None:
        host_port(metrics)
    return ServerConfig(
        database_url=args.database_url,
        listen=args.listen,
        metrics_listen=metrics,
        worker_token=args.worker_token,
        admin_token=args.admin_token,
        insecure=insecure,
        lease_ttl_s=args.lease_ttl,
        heartbeat_interval_s=args.heartbeat_interval,
        stream_grace_s=args.stream_grace,
        claim_max_wait_s=args.claim_max_wait,
        pool_size=args.pool_size,
        shutdown_grace_s=args.shutdown_grace,
        log_format=args.log_format,
    )


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
