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
import time
from collections.abc import Callable, Iterator
from typing import Final

import asyncpg
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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
        # Throttled time by (kind, limit), as this coordinator saw it while leading.
        self.throttled_s: dict[tuple[str, str], float] = {}
        self._seen_at: float | None = None
        registry.register(self)

    def observe(self, latest: stats.Gauges | None, now: float) -> None:
        """The leader's new reading. A limit throttled from one reading to the next if it
        held back a ready task at both: the time between them counts (docs/design.md
        §17, "Watching limits"); a gap with no reading (not leading, or a failed read)
        counts nothing."""
        previous = self.latest
        if latest is not None and previous is not None and self._seen_at is not None:
            before = {(w.kind, w.name) for w in previous.held_back}
            for held in latest.held_back:
                limit = (held.kind, held.name)
                if limit in before:
                    self.throttled_s[limit] = self.throttled_s.get(limit, 0.0) + now - self._seen_at
        self.latest = latest
        self._seen_at = now if latest is not None else None

    def describe(self) -> list[GaugeMetricFamily]:
        # Nothing to read at registration: the series appear once a leader has refreshed.
        return []

    def collect(self) -> Iterator[Metric]:
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
        yield from _held_back(latest, self.throttled_s)


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


def _held_back(latest: stats.Gauges, throttled_s: dict[tuple[str, str], float]) -> Iterator[Metric]:
    waiting = GaugeMetricFamily(
        "awp_limit_waiting_tasks",
        "Ready tasks a limit holds back now (kind: key, a concurrency key; rate, a rate limit)",
        labels=["kind", "limit"],
    )
    for held in latest.held_back:
        waiting.add_metric([held.kind, held.name], held.waiting)
    yield waiting
    throttled = CounterMetricFamily(
        "awp_limit_throttled_seconds",
        "Time a limit held back at least one ready task, as this leader saw it",
        labels=["kind", "limit"],
    )
    for (kind, name), seconds in sorted(throttled_s.items()):
        throttled.add_metric([kind, name], seconds)
    yield throttled


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
                reading = await stats.gauges(pool, RUN_OUTCOME_WINDOW_S)
                gauges.observe(reading, time.monotonic())
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                gauges.observe(None, time.monotonic())
                log.warning("queue gauges not refreshed", extra={"error": repr(exc)})
        else:
            gauges.observe(None, time.monotonic())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await stop.wait()
