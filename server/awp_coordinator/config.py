"""awp-coordinator settings: every one a flag and an AWP_* environment variable."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from awp_common import flags, logs
from awp_common.flags import flag
from awp_db import retention, settings
from awp_db.connect import DEFAULT_LIMITS, PoolMode, SessionLimits
from awp_db.workers import OfflineRule

# How many of its own heartbeat intervals of silence make a worker offline (DESIGN.md
# §3). The interval is the servers' (--heartbeat-interval), stored with each session at
# Register, so it is never configured here a second time.
OFFLINE_AFTER_INTERVALS = 3
# The leader lease's default length, in scan intervals (docs/leadership.md): a standby
# takes over at most this long after the leader last renewed, plus its own wake-up, so
# within 2 intervals; renewals come three times per lease, so one late one loses nothing.
LEADER_TTL_INTERVALS = 1.5
# How long finished runs are kept by default (DESIGN.md §9).
RETENTION_DEFAULT_S = 30 * 86400.0


def default_instance() -> str:
    # The pid first: application_name keeps only 63 bytes and hostnames can be long.
    return f"{os.getpid()}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    database_url: str = field(default="", repr=False, metadata=flags.DATABASE_URL)
    session_database_url: str = field(
        default="", repr=False, metadata=settings.SESSION_DATABASE_URL
    )
    database_pool_mode: PoolMode = field(
        default=PoolMode.SESSION, metadata=settings.DATABASE_POOL_MODE
    )
    no_migrate: bool = field(default=False, metadata=settings.NO_MIGRATE)
    scan_interval_s: float = field(
        default=1.0,
        metadata=flag(
            "--scan-interval",
            "AWP_SCAN_INTERVAL",
            "time between periodic passes; the leader lease lasts 1.5 of them by default",
            read=flags.positive_duration,
        ),
    )
    leader_ttl_s: float | None = field(
        default=None,
        metadata=flag(
            "--leader-ttl",
            "AWP_LEADER_TTL",
            "how long the leader lease lasts unrenewed: a standby takes over this long "
            "after a stuck, cut-off or dead leader last renewed it (renewed 3 times per ttl)",
            read=flags.positive_duration,
            shown=f"{LEADER_TTL_INTERVALS} x --scan-interval",
        ),
    )
    # Only ever lengthens the rule of OFFLINE_AFTER_INTERVALS: a shorter threshold than a
    # session's own intervals would take a worker that heartbeats on time offline.
    offline_after_s: float | None = field(
        default=None,
        metadata=flag(
            "--offline-after",
            "AWP_OFFLINE_AFTER",
            f"least silence before a worker is offline; a worker is offline after the "
            f"longer of this and {OFFLINE_AFTER_INTERVALS} of its heartbeat intervals, "
            "which the servers set",
            read=flags.positive_duration,
            shown="none",
        ),
    )
    # Bounds pending + leased dispatches across the cluster; 0 is unlimited.
    global_dispatch_limit: int = field(
        default=10_000,
        metadata=flag(
            "--global-dispatch-limit",
            "AWP_GLOBAL_DISPATCH_LIMIT",
            "most pending + leased dispatches at once; 0 = unlimited",
            read=flags.whole(0),
        ),
    )
    # Dispatches offered beyond the free slots, as a fraction of the compatible active
    # workers' slots: a worker whose leases finish claims its next ones at once
    # instead of waiting for the pass its Complete triggers. 0: exactly the free slots.
    dispatch_prefetch: float = field(
        default=1.0,
        metadata=flag(
            "--dispatch-prefetch",
            "AWP_DISPATCH_PREFETCH",
            "dispatches offered beyond the free slots, as a fraction of the active "
            "workers' slots (0 = only free slots); within every other limit",
            read=flags.number(0, 100),
        ),
    )
    # Not AWP_METRICS_LISTEN: that is the server's, and a shared environment would make
    # both processes bind one port.
    metrics_listen: str | None = field(
        default="127.0.0.1:9465", metadata=flags.metrics_listen("AWP_COORDINATOR_METRICS_LISTEN")
    )
    stats_interval_s: float = field(
        default=15.0,
        metadata=flag(
            "--stats-interval",
            "AWP_COORDINATOR_STATS_INTERVAL",
            "how often the leader reads the queue, fleet and run-outcome gauges it exports",
            read=flags.positive_duration,
        ),
    )
    # The coordinator does not know the servers' lease TTL: it takes the limits of the
    # default one unless told (one AWP_DB_STALL_TIMEOUT can serve every process).
    db_stall_timeout_s: float = field(
        default=DEFAULT_LIMITS.stall_s,
        metadata=flags.db_stall_timeout(),
    )
    log_format: str = field(default=logs.DEFAULT_FORMAT, metadata=flags.LOG_FORMAT)
    log_level: str = field(default=logs.DEFAULT_LEVEL, metadata=flags.LOG_LEVEL)
    pool_size: int = field(
        default=4,
        metadata=flag(
            "--pool-size",
            "AWP_COORDINATOR_POOL_SIZE",
            "database connections for passes and the leader lease (plus one for LISTEN)",
            read=flags.whole(1),
        ),
    )
    # Items one transaction of a pass handles at most; a full batch makes the next pass
    # start at once, so a backlog drains in short transactions.
    batch_size: int = field(
        default=500,
        metadata=flag(
            "--batch-size",
            "AWP_COORDINATOR_BATCH_SIZE",
            "items one pass transaction handles at most",
            read=flags.whole(1),
        ),
    )
    # Retention (awp_db.retention, docs/retention.md): the leader deletes what is past it.
    retention_s: float = field(
        default=RETENTION_DEFAULT_S,
        metadata=flag(
            "--retention",
            "AWP_RETENTION",
            "finished runs (succeeded, failed, canceled) older than this are deleted with "
            "everything that belongs to them; 0 = keep forever",
            read=flags.duration,
        ),
    )
    retention_batch: int = field(
        default=retention.BATCH_RUNS,
        metadata=flag(
            "--retention-batch",
            "AWP_RETENTION_BATCH",
            "finished runs one retention transaction deletes at most",
            read=flags.whole(1, 10_000),
        ),
    )
    # Names this process in pg_stat_activity (application_name) and in logs.
    instance: str = field(
        default_factory=default_instance,
        metadata=flag(
            "--instance",
            "AWP_COORDINATOR_INSTANCE",
            "this process's name in pg_stat_activity and in logs",
            shown="<pid>@<hostname>",
        ),
    )

    @property
    def session_url(self) -> str:
        """Where LISTEN and migrations connect: a session of their own."""
        return self.session_database_url or self.database_url

    @property
    def session_limits(self) -> SessionLimits:
        return SessionLimits(self.db_stall_timeout_s)

    @property
    def leader_ttl(self) -> float:
        return self.leader_ttl_s or LEADER_TTL_INTERVALS * self.scan_interval_s

    @property
    def offline_rule(self) -> OfflineRule:
        floor_s = self.offline_after_s or 0.0
        return OfflineRule(OFFLINE_AFTER_INTERVALS, round(floor_s * 1000))


def parse(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> CoordinatorConfig:
    return flags.parse(
        CoordinatorConfig,
        argv,
        environ=environ,
        prog="awp-coordinator",
        description=(
            "Creates dispatches within the limits, reaps expired leases and timed-out "
            "attempts, marks silent workers offline, converges cancellations and releases "
            "retry timers. Run several: one leads (a lease in the database), the others "
            "stand by and take over. Behind a transaction pooler, give "
            "--database-pool-mode transaction and a --session-database-url for LISTEN "
            "(docs/postgres.md)."
        ),
        check=_check,
    )


def _check(config: CoordinatorConfig) -> None:
    settings.check_urls(config.database_url, config.session_database_url, config.database_pool_mode)
