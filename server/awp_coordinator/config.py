"""awp-coordinator settings: every one a flag and an AWP_* environment variable."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from awp_common.flags import EnvArgumentParser, host_port, positive_float

# How many heartbeat intervals of silence make a worker offline (DESIGN.md §3).
OFFLINE_AFTER_INTERVALS = 3


def default_instance() -> str:
    # The pid first: application_name keeps only 63 bytes and hostnames can be long.
    return f"{os.getpid()}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    database_url: str = ""
    scan_interval_s: float = 1.0
    # Must match the servers': a worker is offline after OFFLINE_AFTER_INTERVALS of them.
    heartbeat_interval_s: float = 5.0
    offline_after_s: float | None = None
    # Bounds pending + leased dispatches across the cluster; 0 is unlimited.
    global_dispatch_limit: int = 10_000
    # Dispatches offered beyond the free slots, as a fraction of the compatible active
    # workers' slots: a worker whose leases finish claims its next ones at once
    # instead of waiting for the pass its Complete triggers. 0: exactly the free slots.
    dispatch_prefetch: float = 1.0
    metrics_listen: str | None = "127.0.0.1:9465"
    log_format: str = "json"
    log_level: str = "info"
    pool_size: int = 4
    # Items one transaction of a pass handles at most; a full batch makes the next pass
    # start at once, so a backlog drains in short transactions.
    batch_size: int = 500
    # Names this process in pg_stat_activity (application_name) and in logs.
    instance: str = field(default_factory=default_instance)

    @property
    def offline_after_ms(self) -> int:
        seconds = self.offline_after_s
        if seconds is None:
            seconds = OFFLINE_AFTER_INTERVALS * self.heartbeat_interval_s
        return max(1, round(seconds * 1000))


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be 0 to 100, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse(argv: Sequence[str] | None = None) -> CoordinatorConfig:
    parser = EnvArgumentParser(
        prog="awp-coordinator",
        description=(
            "Creates dispatches within the limits, reaps expired leases and timed-out "
            "attempts, marks silent workers offline, converges cancellations and releases "
            "retry timers. Run several: one leads (a PostgreSQL advisory lock), the others "
            "stand by and take over. Behind pgbouncer, point it at a session-mode pool: the "
            "leader lock and LISTEN need session state."
        ),
    )
    parser.add("--database-url", env="AWP_DATABASE_URL", help="PostgreSQL URL (required)")
    parser.add(
        "--scan-interval",
        env="AWP_SCAN_INTERVAL",
        default=1.0,
        type=positive_float,
        help="seconds between periodic passes; standbys try for the lock twice as often",
    )
    parser.add(
        "--heartbeat-interval",
        env="AWP_HEARTBEAT_INTERVAL",
        default=5.0,
        type=positive_float,
        help="the servers' worker heartbeat interval, seconds (must match theirs)",
    )
    parser.add(
        "--offline-after",
        env="AWP_OFFLINE_AFTER",
        default=None,
        type=positive_float,
        help=f"seconds of silence before a worker is offline "
        f"(default {OFFLINE_AFTER_INTERVALS} x heartbeat interval)",
    )
    parser.add(
        "--global-dispatch-limit",
        env="AWP_GLOBAL_DISPATCH_LIMIT",
        default=10_000,
        type=_non_negative_int,
        help="most pending + leased dispatches at once; 0 = unlimited",
    )
    parser.add(
        "--dispatch-prefetch",
        env="AWP_DISPATCH_PREFETCH",
        default=1.0,
        type=_non_negative_float,
        help="dispatches offered beyond the free slots, as a fraction of the active "
        "workers' slots (0 = only free slots); within every other limit",
    )
    # Not AWP_METRICS_LISTEN: that is the server's, and a shared environment would make
    # both processes bind one port.
    parser.add(
        "--metrics-listen",
        env="AWP_COORDINATOR_METRICS_LISTEN",
        default="127.0.0.1:9465",
        help="Prometheus HOST:PORT, or 'off'",
    )
    parser.add("--log-format", env="AWP_LOG_FORMAT", default="json", choices=["json", "text"])
    parser.add(
        "--log-level",
        env="AWP_LOG_LEVEL",
        default="info",
        choices=["debug", "info", "warning", "error"],
    )
    parser.add(
        "--pool-size",
        env="AWP_COORDINATOR_POOL_SIZE",
        default=4,
        type=_positive_int,
        help="database connections for passes (plus one for the lock, one for LISTEN)",
    )
    parser.add(
        "--batch-size",
        env="AWP_COORDINATOR_BATCH_SIZE",
        default=500,
        type=_positive_int,
        help="items one pass transaction handles at most",
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("--database-url (or AWP_DATABASE_URL) is required")
    if args.offline_after is not None and args.offline_after <= args.heartbeat_interval:
        parser.error("--offline-after must be longer than --heartbeat-interval")
    metrics = None if args.metrics_listen in ("", "off") else args.metrics_listen
    if metrics is not None:
        try:
            host_port(metrics)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--metrics-listen: {exc}")
    return CoordinatorConfig(
        database_url=args.database_url,
        scan_interval_s=args.scan_interval,
        heartbeat_interval_s=args.heartbeat_interval,
        offline_after_s=args.offline_after,
        global_dispatch_limit=args.global_dispatch_limit,
        dispatch_prefetch=args.dispatch_prefetch,
        metrics_listen=metrics,
        log_format=args.log_format,
        log_level=args.log_level,
        pool_size=args.pool_size,
        batch_size=args.batch_size,
    )
