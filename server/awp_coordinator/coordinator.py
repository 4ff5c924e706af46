"""The coordinator: passes over the database, and the leader loop that drives them.

`run_pass()` works without leadership (tests drive passes directly, and two coordinators
running passes at once stay correct); given a leader's term, each of its transactions
writes only while that term holds. `run()` is the process loop: contend for the leader
lease, and while leading run a pass on every notification, on every scan tick and at
the next known deadline; beside the passes, on a connection of its own, delete the
finished runs past the retention age (`prune_once()`, paced by awp_db.retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Final

from awp_common import tracing
from awp_coordinator import spans
from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.leadership import Leadership
from awp_coordinator.metrics import Metrics
from awp_db import coordination, retention, schedules
from awp_db.connect import Pool
from awp_db.leadership import Superseded, Term
from awp_db.listen import Listener, Waiter
from awp_db.signals import COORDINATOR_CHANNEL

log = logging.getLogger("awp.coordinator")

# Shortest sleep when something is already due but the pass could not take it (a row
# another transaction holds): try again soon without spinning.
MIN_SLEEP_S: Final = 0.05
# A deadline is acted on a little after it, never just before (the database's checks
# are strict inequalities against its live clock).
DUE_MARGIN_S: Final = 0.005
# The LISTEN connection's keepalive: a silently dead connection is noticed within this.
KEEPALIVE_MAX_S: Final = 5.0
# How often the leader looks for runs that have newly passed the retention age, once
# the backlog is gone (retention is measured in days: a minute late is nothing).
RETENTION_CHECK_S: Final = 60.0


@dataclass(slots=True)
class PassReport:
    """What one pass changed, by kind of work."""

    canceled_runs: int = 0
    offline_workers: int = 0
    offline_leases: int = 0
    interrupted: int = 0
    timed_out: int = 0
    retries_released: int = 0
    starts_released: int = 0
    waits_released: int = 0
    wait_tasks_started: int = 0
    ticks_fired: int = 0
    withdrawn: int = 0
    dispatched: int = 0
    runs_started: int = 0
    runs_finished: int = 0
    # Seconds until the earliest known lease expiry, deadline, retry or offline
    # threshold (negative if overdue), None when nothing is pending.
    next_due_in: float | None = None

    def counts(self) -> dict[str, int]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "next_due_in"
        }

    @property
    def did_work(self) -> bool:
        return any(self.counts().values())


class Coordinator:
    def __init__(
        self, pool: Pool, config: CoordinatorConfig, metrics: Metrics | None = None
    ) -> None:
        self._pool = pool
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self._last_sweep = float("-inf")
        self._last_traces = float("-inf")
        self._leading = False

    @property
    def leading(self) -> bool:
        return self._leading

    # --- one pass --------------------------------------------------------------------

    async def run_pass(self, term: Term | None = None) -> PassReport:
        """Every kind of work that is due, each in its own short transaction, in an order
        where each step feeds the next: cancellations first (nothing is dispatched for a
        run being canceled), then what frees capacity or makes tasks ready, then dispatch.

        One read first says which kinds of work have candidates, so a pass woken by a
        notification (a result, a new run) costs one round trip plus the dispatch
        transaction instead of a round trip or a transaction per kind. Each step still
        selects and re-checks its own candidates under its locks; anything that becomes
        due after that read is found by the next pass, which starts at once after a pass
        that did work, on the next notification, or at the next known deadline.

        With a term, a transaction that finds the term over writes nothing and raises
        Superseded, ending the pass (what it committed before that was the term's).
        """
        config = self.config
        batch = config.batch_size
        report = PassReport()
        started = time.perf_counter()
        async with self._pool.acquire() as conn:
            due = await coordination.due(conn, config.offline_rule, config.dispatch_prefetch)
            report.next_due_in = due.next_due_in
            if due.cancels:
                report.canceled_runs = len(
                    await coordination.converge_cancels(conn, batch, term=term)
                )

            if due.silent_workers:
                step_ns = tracing.now_ns()
                offline = await coordination.mark_silent_offline(
                    conn, config.offline_rule, term=term
                )
                report.offline_workers = len(offline.workers)
                report.offline_leases = offline.leases
                if tracing.enabled():
                    runs = await spans.rescued(conn, offline.dispatch_ids, spans.OFFLINE)
                    spans.step(tracing.REAP_SPAN, step_ns, offline.leases, runs)

            if due.expired_leases:
                step_ns = tracing.now_ns()
                reaped = await coordination.reap_expired(conn, batch, term=term)
                report.interrupted = reaped.interrupted
                report.timed_out = reaped.timed_out
                report.runs_finished += len(reaped.settled.runs_finished)
                if tracing.enabled():
                    runs = await spans.rescued(conn, reaped.dispatch_ids, spans.EXPIRED)
                    spans.step(tracing.REAP_SPAN, step_ns, len(reaped.dispatch_ids), runs)

            # Settling attempts just now may have started retry timers of 0 ms.
            if due.retries or report.offline_leases or report.interrupted or report.timed_out:
                report.retries_released = await coordination.release_retries(conn, batch, term=term)
            if due.waits:
                report.waits_released = await coordination.release_waits(conn, batch, term=term)
            if due.wait_tasks:
                report.wait_tasks_started = await coordination.start_wait_tasks(
                    conn, batch, term=term
                )
            if due.starts:
                report.starts_released = await coordination.release_starts(conn, batch, term=term)
            # Ticks are created only under a leader's term (awp_db.schedules): a pass
            # without one leaves them to the leader.
            if due.schedules and term is not None:
                fired = await schedules.fire_due(conn, term, batch)
                report.ticks_fired = fired.ticks
                report.runs_started = len(fired.started)
            if due.unservable or report.offline_workers:
                report.withdrawn = await coordination.withdraw_unservable(conn, batch, term=term)

            # Settlement finishes runs itself; the sweep is a safety net, so once per
            # scan interval is enough, not once per notification.
            if time.monotonic() - self._last_sweep >= config.scan_interval_s:
                self._last_sweep = time.monotonic()
                report.runs_finished += len(
                    await coordination.sweep_finished(conn, batch, term=term)
                )

            # Dispatching needs ready tasks and offers running short (most passes woken
            # by results find the prefetch still covering the free slots); what
            # this pass settled or canceled may have freed slots or offers since `due`.
            freed = (
                report.interrupted
                or report.timed_out
                or report.offline_leases
                or report.canceled_runs
                or report.withdrawn
            )
            made_ready = (
                report.retries_released
                or report.starts_released
                or report.waits_released
                or report.runs_started
            )
            if made_ready or (due.ready and (due.short or freed)):
                step_ns = tracing.now_ns()
                dispatched = await coordination.create_dispatches(
                    conn, config.global_dispatch_limit, config.dispatch_prefetch, term=term
                )
                report.dispatched = dispatched.created
                spans.step(tracing.DISPATCH_SPAN, step_ns, dispatched.created)
                if dispatched.skipped_runs and not dispatched.created:
                    # Only busy runs had work: come back shortly (MIN_SLEEP_S), not at
                    # the next scan. (A pass that dispatched anything is followed at once.)
                    report.next_due_in = 0.0
            # A run's span waits for the run's end anyway: once per scan interval is
            # enough, not a statement more per pass.
            if tracing.enabled() and time.monotonic() - self._last_traces >= config.scan_interval_s:
                self._last_traces = time.monotonic()
                await spans.finished_runs(conn, batch)
        self._record(report, time.perf_counter() - started)
        return report

    async def converge_cancels(self) -> int:
        """Only the cancel convergence (also the first step of every pass)."""
        async with self._pool.acquire() as conn:
            return len(await coordination.converge_cancels(conn, self.config.batch_size))

    def _record(self, report: PassReport, seconds: float) -> None:
        self.metrics.passes.inc()
        self.metrics.pass_seconds.observe(seconds)
        counts = {kind: n for kind, n in report.counts().items() if n}
        for kind, n in counts.items():
            self.metrics.items.labels(kind).inc(n)
        if counts:
            log.info("pass", extra={**counts, "ms": round(seconds * 1000, 1)})

    def sleep_after(self, report: PassReport) -> float:
        """How long to wait for a notification before the next pass."""
        if report.did_work:
            return 0.0
        delay = self.config.scan_interval_s
        if report.next_due_in is not None:
            delay = min(delay, max(report.next_due_in + DUE_MARGIN_S, MIN_SLEEP_S))
        return delay

    # --- retention -------------------------------------------------------------------

    async def prune_once(self, term: Term | None = None) -> retention.Pruned:
        """One retention batch: up to --retention-batch of the runs that finished more
        than --retention ago, deleted with all their rows (none with retention 0)."""
        config = self.config
        if not config.retention_s:
            return retention.Pruned()
        async with self._pool.acquire() as conn:
            before = await retention.cutoff(conn, config.retention_s)
            pruned = await retention.prune_batch(conn, before, config.retention_batch, term=term)
        for table, rows in pruned.by_table().items():
            if rows:
                self.metrics.retention_deleted.labels(table).inc(rows)
        return pruned

    async def retention_backlog(self) -> int:
        """Finished runs past the retention age still stored (0 with retention 0)."""
        if not self.config.retention_s:
            return 0
        async with self._pool.acquire() as conn:
            before = await retention.cutoff(conn, self.config.retention_s)
            return await retention.backlog(conn, before)

    async def _prune(self, leadership: Leadership, term: Term) -> None:
        """While leading: deletes the retention backlog a batch at a time, resting after
        each full batch as long as it took (so that it never takes more than half of one
        connection from the passes), then looks again every RETENTION_CHECK_S.

        The backlog is counted when a drain starts and ends and counted down in between,
        so that a large one is not re-counted after every batch."""
        batch = self.config.retention_batch
        backlog: int | None = None
        drained = retention.Pruned()
        drain_started = time.monotonic()
        while True:
            started = time.monotonic()
            try:
                pruned = await self.prune_once(term)
                full = pruned.runs >= batch
                if full and backlog is not None:
                    backlog = max(backlog - pruned.runs, 0)
                else:
                    backlog = await self.retention_backlog()
            except Superseded as exc:
                leadership.lose(f"superseded: {exc}")
                return
            except Exception:
                # Retried after a check interval; the passes go on meanwhile.
                log.exception("retention batch failed")
                backlog = None
                await asyncio.sleep(RETENTION_CHECK_S)
                continue
            self.metrics.retention_backlog.set(backlog)
            if not drained.runs:
                drain_started = started
            drained += pruned
            if full:
                await asyncio.sleep(retention.rest_after(time.monotonic() - started))
                continue
            if drained.runs:
                seconds = time.monotonic() - drain_started
                log.info(
                    "retention pruned",
                    extra={**drained.by_table(), "backlog": backlog, "s": round(seconds, 2)},
                )
                drained = retention.Pruned()
            # Runs left over are held by other transactions right now: soon, not in a minute.
            await asyncio.sleep(self.config.scan_interval_s if backlog else RETENTION_CHECK_S)

    # --- the process loop ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Contends for leadership until stop is set; leads while its term holds."""
        config = self.config
        leadership = Leadership(
            self._pool, config.instance, config.leader_ttl, config.global_dispatch_limit
        )
        listener = Listener(
            config.session_url,
            [COORDINATOR_CHANNEL],
            keepalive_s=max(min(config.scan_interval_s, KEEPALIVE_MAX_S), 1.0),
        )
        await listener.start()
        standing_by = False
        try:
            async with listener.subscribe(COORDINATOR_CHANNEL) as waiter:
                while not stop.is_set():
                    if not await leadership.try_acquire():
                        if not standing_by:
                            standing_by = True
                            log.info("standing by", extra={"instance": config.instance})
                        # Until the lease seen expires, or a renewal interval at most.
                        await _wait(stop, leadership.retry_in)
                        continue
                    standing_by = False
                    term = leadership.term
                    assert term is not None
                    self._set_leading(True, term=term, previous=leadership.previous_holder)
                    try:
                        await self._lead(stop, leadership, term, waiter)
                    finally:
                        self._set_leading(False, why=leadership.lost_reason)
        finally:
            await leadership.release()
            await listener.stop()

    def _set_leading(
        self, leading: bool, *, term: Term | None = None, previous: str = "", why: str = ""
    ) -> None:
        self._leading = leading
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.leadership_changes.labels("acquired" if leading else "released").inc()
        extra: dict[str, object] = {"leader": leading, "instance": self.config.instance}
        if term is not None:
            self.metrics.leader_epoch.set(term.epoch)
            extra["epoch"] = term.epoch
            if previous and previous != term.holder:
                self.metrics.takeovers.inc()
                extra["previous"] = previous
        if why:
            extra["why"] = why
        if leading:
            log.info("leadership acquired", extra=extra)
        elif why:
            log.warning("leadership lost", extra=extra)
        else:
            log.info("leadership released", extra=extra)

    async def _lead(
        self, stop: asyncio.Event, leadership: Leadership, term: Term, waiter: Waiter
    ) -> None:
        """Runs passes until stop is set or the term is over; either ends them at once."""
        work = asyncio.create_task(
            self._passes(leadership, term, waiter), name="awp-coordinator-passes"
        )
        stopped = asyncio.create_task(stop.wait())
        lost = asyncio.create_task(leadership.wait_lost())
        tasks = [work, stopped, lost]
        if self.config.retention_s:
            tasks.append(
                asyncio.create_task(self._prune(leadership, term), name="awp-coordinator-retention")
            )
        try:
            await asyncio.wait({work, stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _passes(self, leadership: Leadership, term: Term, waiter: Waiter) -> None:
        while True:
            try:
                report = await self.run_pass(term)
            except Superseded as exc:
                # Another coordinator took over while this one was stalled or cut off:
                # this pass wrote nothing more, and the process goes back to standing by.
                leadership.lose(f"superseded: {exc}")
                return
            except Exception:
                # A daemon outlives one bad pass (a deadlock victim, a database restart):
                # everything is re-read from the database next time.
                self.metrics.pass_errors.inc()
                log.exception("coordinator pass failed")
                await waiter.wait(self.config.scan_interval_s)
                continue
            delay = self.sleep_after(report)
            if delay <= 0:
                # Let a stop or a lost term be seen between back-to-back passes.
                await asyncio.sleep(0)
                continue
            await waiter.wait(delay)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
