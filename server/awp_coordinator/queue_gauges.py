"""The queue, the fleet and recent run outcomes as gauges, read from the database by the
leader coordinator (awp_db.stats.gauges) every --stats-interval.

Only the leader exports them; a standby exports none of these series, so that summing
over every coordinator counts each figure once (during a hand-over two may briefly
overlap: dashboards and alerts take the max per label set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Final

import asyncpg
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from awp_db import stats
from awp_db.connect import Pool

log = logging.getLogger("awp.coordinator")

# The run outcomes cover the runs finished within this window before each refresh.
RUN_OUTCOME_WINDOW_S: Final = 300.0
WORKER_STATES: Final = ("active", "draining")
DISPATCH_STATES: Final = ("pending", "leased")


class QueueGauges(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.latest: stats.Gauges | None = None
        registry.register(self)

    def describe(self) -> list[GaugeMetricFamily]:
        # Nothing to read at registration: the series appear once a leader has refreshed.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        latest = self.latest
        if latest is None:
            return
        dispatches = GaugeMetricFamily(
            "awp_dispatches",
            "Pending and leased dispatches, by executor kind (leader coordinator)",
            labels=["state", "executor_kind"],
        )
        # The kinds with work, and those live workers serve: a kind whose backlog drained
        # reads 0 rather than vanishing (a gap in a graph, no answer for an autoscaler).
        counts = (*latest.dispatches, *latest.ready_tasks, *latest.served_kinds)
        kinds = sorted({c.label for c in counts if c.label})
        counted = {(c.state, c.label): c.count for c in latest.dispatches}
        for kind in kinds:
            for state in DISPATCH_STATES:
                dispatches.add_metric([state, kind], counted.get((state, kind), 0))
        yield dispatches
        ready = GaugeMetricFamily(
            "awp_ready_tasks",
            "Ready tasks of running runs not yet offered to a worker, by executor kind; "
            "dispatches are made only while a compatible worker has room, so this is the "
            "backlog beyond them",
            labels=["executor_kind"],
        )
        ready_by_kind = {c.label: c.count for c in latest.ready_tasks}
        for kind in kinds:
            ready.add_metric([kind], ready_by_kind.get(kind, 0))
        yield ready
        by_priority = GaugeMetricFamily(
            "awp_ready_tasks_by_priority",
            "Ready tasks not yet offered to a worker, by base priority (the run's plus the "
            "task's; only priorities with ready tasks are listed)",
            labels=["priority"],
        )
        for count in latest.ready_by_priority:
            by_priority.add_metric([count.label or "0"], count.count)
        yield by_priority
        yield GaugeMetricFamily(
            "awp_oldest_pending_dispatch_seconds",
            "Age of the oldest pending dispatch (0 when none is pending)",
            value=(latest.oldest_pending_ms or 0.0) / 1000,
        )
        workers = GaugeMetricFamily(
            "awp_workers", "Worker sessions by state: active, draining", labels=["state"]
        )
        by_state = {c.state: c.count for c in latest.workers}
        for state in WORKER_STATES:
            workers.add_metric([state], by_state.get(state, 0))
        yield workers
        yield GaugeMetricFamily(
            "awp_running_runs",
            "Runs not finished yet",
            value=sum(c.count for c in latest.running_runs),
        )
        outcomes = GaugeMetricFamily(
            "awp_recent_run_outcomes",
            f"Runs finished in the last {RUN_OUTCOME_WINDOW_S:g} s, by workflow name and "
            "outcome: succeeded, failed, canceled",
            labels=["workflow", "outcome"],
        )
        for count in sorted(latest.finished_runs, key=lambda c: (c.label or "", c.state)):
            outcomes.add_metric([count.label or "", count.state], count.count)
        yield outcomes
        yield from _flow(latest)


def _flow(latest: stats.Gauges) -> Iterator[GaugeMetricFamily]:
    """Flow control (docs/workflows.md): concurrency units held, and each rate limit's
    budget, use in the window ending now and pause."""
    yield GaugeMetricFamily(
        "awp_concurrency_units_held",
        "Concurrency-key units held by live leases (pending or leased dispatches)",
        value=latest.units_held,
    )
    yield GaugeMetricFamily(
        "awp_concurrency_keys_held",
        "Distinct concurrency keys with a unit held",
        value=latest.keys_held,
    )
    units = GaugeMetricFamily(
        "awp_rate_limit_units", "A rate limit's units per period", labels=["limit"]
    )
    used = GaugeMetricFamily(
        "awp_rate_limit_used_units",
        "Units charged to a rate limit in the period ending now (reported usage where known)",
        labels=["limit"],
    )
    paused = GaugeMetricFamily(
        "awp_rate_limit_paused", "1 while a slow-down report pauses the limit", labels=["limit"]
    )
    for limit in latest.rate_limits:
        units.add_metric([limit.name], limit.units)
        used.add_metric([limit.name], limit.used)
        paused.add_metric([limit.name], 1 if limit.paused else 0)
    yield units
    yield used
    yield paused
    capacity = GaugeMetricFamily(
        "awp_worker_resource_capacity",
        "A live worker's capacity of a countable resource (--resource)",
        labels=["worker", "worker_name", "resource"],
    )
    reserved = GaugeMetricFamily(
        "awp_worker_resource_reserved",
        "Units of a worker's resource its live leases reserve",
        labels=["worker", "worker_name", "resource"],
    )
    for use in latest.resources:
        labels = [str(use.worker_id), use.worker_name, use.resource]
        capacity.add_metric(labels, use.capacity)
        reserved.add_metric(labels, use.reserved)
    yield capacity
    yield reserved


async def refresh(
    gauges: QueueGauges,
    pool: Pool,
    leading: Callable[[], bool],
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Until stop: the leader reads the figures every interval_s; a standby, or a
    leader that cannot read them, exports none (stale figures would mislead)."""
    while not stop.is_set():
        if leading():
            try:
                gauges.latest = await stats.gauges(pool, RUN_OUTCOME_WINDOW_S)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                gauges.latest = None
                log.warning("queue gauges not refreshed", extra={"error": repr(exc)})
        else:
            gauges.latest = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()
