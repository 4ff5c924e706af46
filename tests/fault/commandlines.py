"""The command lines of a fault scenario's processes: awp-server, awp-coordinator and
awp-worker as an operator would run them (the console scripts of this venv, through the
shared launcher's awp_common.processes.command), with compressed timings.

Timings are short but keep production's proportions: the lease (2 s) stays well above
the worker's safety margin (0.5 s) and eight heartbeat intervals (0.25 s), so a healthy
worker never loses a lease to scheduling noise on a busy two-core machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from awp_common.processes import command

WORKER_TOKEN = "fault-worker-token"
ADMIN_TOKEN = "fault-admin-token"


@dataclass(frozen=True, slots=True)
class Timings:
    lease_ttl_s: float = 2.0
    heartbeat_s: float = 0.25
    stream_grace_s: float = 0.75
    scan_s: float = 0.25
    safety_margin_s: float = 0.5
    # A floor above 3 heartbeat intervals (0.75 s): a server restart silences every worker for
    # the restart itself (0.3-0.9 s here) plus its channel's reconnect backoff (capped at 1 s,
    # +20% jitter) -- up to ~2.5 s -- and a healthy session must survive that. Production
    # proportions (5 s heartbeat, 15 s offline) have the slack; compressed timings need it
    # spelled out. Leases still expire after 2 s, a killed worker's after the 0.75 s grace.
    offline_after_s: float = 4.0
    # A worker's claim long poll; short so a restarted server is not kept waiting on it.
    claim_wait_s: float = 2.0
    shutdown_grace_s: float = 15.0


def server(t: Timings, *, database_url: str, listen: str, extra: Sequence[str] = ()) -> list[str]:
    return [
        *command("awp-server"),
        "--database-url", database_url,
        "--listen", listen,
        "--metrics-listen", "off",
        "--worker-token", WORKER_TOKEN,
        "--admin-token", ADMIN_TOKEN,
        "--lease-ttl", str(t.lease_ttl_s),
        "--heartbeat-interval", str(t.heartbeat_s),
        "--stream-grace", str(t.stream_grace_s),
        "--log-format", "json",
        *extra,
    ]  # fmt: skip


def coordinator(
    t: Timings, *, database_url: str, instance: str, extra: Sequence[str] = ()
) -> list[str]:
    return [
        *command("awp-coordinator"),
        "--database-url", database_url,
        "--instance", instance,
        "--scan-interval", str(t.scan_s),
        "--offline-after", str(t.offline_after_s),
        "--metrics-listen", "off",
        "--log-format", "json",
        *extra,
    ]  # fmt: skip


def worker(
    t: Timings, *, server: str, name: str, concurrency: int, shutdown_grace: float | None
) -> list[str]:
    """A worker of the mock executor."""
    return [
        *command("awp-worker"),
        "--server", server,
        "--worker-token", WORKER_TOKEN,
        "--name", name,
        "--kinds", "mock",
        "--concurrency", str(concurrency),
        "--shutdown-grace",
        str(shutdown_grace if shutdown_grace is not None else t.shutdown_grace_s),
        "--safety-margin", str(t.safety_margin_s),
        "--claim-wait", str(t.claim_wait_s),
        "--metrics-listen", "off",
        "--log-format", "json",
    ]  # fmt: skip
