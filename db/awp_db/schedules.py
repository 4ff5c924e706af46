"""Schedules: their rows, and firing their ticks exactly once (docs/schedules.md).

A tick fires in one transaction that holds its schedule's row: it inserts the tick,
keyed by (schedule, tick instant), decides the overlap policy, starts the run (which
records the schedule and tick) and advances the schedule. The coordinator's firing
transaction also opens with the leader term check (awp_db.leadership.transaction) and
inserts each tick only where the leader row still carries that term: a coordinator that
lost leadership creates no tick, and the key makes a second fire of a tick impossible
rather than deduplicated after the fact. Requests (trigger, backfill) create ticks under
the same key, so a backfill over ticks that already fired starts nothing twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from awp_common.tracing import RunTrace
from awp_db import locks, runs, settle, workflows
from awp_db.connect import Conn, Pool
from awp_db.leadership import Term, transaction
from awp_db.queries import queries, row_as, rows_as
from awp_kernel.errors import AwpError, ErrorKind, invalid, not_found
from awp_kernel.schedules import (
    MAX_BACKFILL_TICKS,
    Cadence,
    Overlap,
    cadence,
    check_policies,
    decide_overlap,
    plan,
)
from awp_protocol.errors import Reason

Q = queries("schedules")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as a client gives it (checked by `check`)."""

    name: str
    workflow_name: str
    workflow_version: int
    input: dict[str, Any]
    cron: str
    interval_ms: int
    timezone: str
    overlap: str
    catchup: str
    catchup_window_ms: int
    paused: bool = False


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    id: UUID
    name: str
    workflow_name: str
    workflow_version: int
    input: dict[str, Any]
    cron: str | None
    interval_ms: int | None
    timezone: str
    overlap: str
    catchup: str
    catchup_window_ms: int
    paused: bool
    next_tick_at: datetime
    created_at: datetime
    created_by: str
    updated_at: datetime
    updated_by: str


@dataclass(frozen=True, slots=True)
class TickRow:
    tick_at: datetime
    source: str
    leader_epoch: int | None
    outcome: str
    run_id: UUID | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Fired:
    """What one firing transaction did: ticks by outcome, and the runs it started."""

    started: list[UUID] = field(default_factory=list)
    skipped: int = 0
    buffered: int = 0
    # Of the runs started, those of ticks buffered earlier (fired then, not now).
    buffered_started: int = 0

    @property
    def ticks(self) -> int:
        return len(self.started) - self.buffered_started + self.skipped + self.buffered


def _cadence_of(row: ScheduleRow | locks.LockedSchedule) -> Cadence:
    return Cadence(row.cron, row.interval_ms, row.timezone)


async def _now(conn: Conn) -> datetime:
    now: datetime = await conn.fetchval(Q["now"])
    return now


def _args(spec: ScheduleSpec, next_tick: datetime, by: str) -> list[Any]:
    return [
        spec.name,
        spec.workflow_name,
        spec.workflow_version,
        spec.input,
        spec.cron or None,
        spec.interval_ms or None,
        spec.timezone,
        spec.overlap,
        spec.catchup,
        spec.catchup_window_ms,
        spec.paused,
        next_tick,
        by,
    ]


async def _checked(conn: Conn, spec: ScheduleSpec) -> Cadence:
    """The spec's cadence; refuses bad fields naming them, and an unknown workflow."""
    found = cadence(spec.cron, spec.interval_ms, spec.timezone)
    check_policies(spec.overlap, spec.catchup, spec.catchup_window_ms)
    await workflows.get(conn, spec.workflow_name, spec.workflow_version)
    return found


async def create(conn: Conn, spec: ScheduleSpec, by: str) -> ScheduleRow:
    async with conn.transaction():
        cad = await _checked(conn, spec)
        row = await row_as(
            ScheduleRow, conn, Q["insert"], *_args(spec, cad.after(await _now(conn)), by)
        )
        if row is None:
            raise AwpError(
                ErrorKind.ALREADY_EXISTS,
                Reason.SCHEDULE_EXISTS,
                f"schedule {spec.name!r} already exists",
                metadata={"name": spec.name},
            )
        await settle.notify_coordinator(conn, "schedule")
    return row


async def update(conn: Conn, spec: ScheduleSpec, by: str) -> ScheduleRow:
    """Replaces the schedule's definition; it fires from the next tick after now."""
    async with conn.transaction():
        await _lock(conn, spec.name)
        cad = await _checked(conn, spec)
        row = await row_as(
            ScheduleRow, conn, Q["update"], *_args(spec, cad.after(await _now(conn)), by)
        )
        assert row is not None, "locked above"
        await settle.notify_coordinator(conn, "schedule")
    return row


async def set_paused(conn: Conn, name: str, paused: bool, by: str) -> ScheduleRow:
    async with conn.transaction():
        locked = await _lock(conn, name)
        after = _cadence_of(locked).after(await _now(conn))
        row = await row_as(ScheduleRow, conn, Q["set_paused"], name, paused, after, by)
        assert row is not None, "locked above"
        await settle.notify_coordinator(conn, "schedule")
    return row


async def delete(conn: Conn | Pool, name: str) -> None:
    """Deletes the schedule and its ticks; its runs keep their schedule id and tick."""
    if await conn.fetchval(Q["delete"], name) is None:
        raise not_found(Reason.SCHEDULE_NOT_FOUND, f"schedule {name!r}")


async def get(conn: Conn | Pool, name: str) -> ScheduleRow:
    row = await row_as(ScheduleRow, conn, Q["get"], name)
    if row is None:
        raise not_found(Reason.SCHEDULE_NOT_FOUND, f"schedule {name!r}")
    return row


async def list_page(conn: Conn | Pool, after: str, limit: int) -> list[ScheduleRow]:
    return await rows_as(ScheduleRow, conn, Q["list"], after, limit)


async def recent_ticks(conn: Conn | Pool, schedule_id: UUID, limit: int) -> list[TickRow]:
    return await rows_as(TickRow, conn, Q["recent_ticks"], schedule_id, limit)


async def _lock(conn: Conn, name: str) -> locks.LockedSchedule:
    row = await get(conn, name)
    found = await locks.schedules(conn, [row.id], skip_locked=False)
    if not found:  # deleted in between
        raise not_found(Reason.SCHEDULE_NOT_FOUND, f"schedule {name!r}")
    return found[0]


# --- firing ----------------------------------------------------------------------------


async def _start_run(
    conn: Conn, schedule: locks.LockedSchedule, tick: datetime, by: str, epoch: int | None
) -> UUID:
    workflow = await workflows.get(conn, schedule.workflow_name, schedule.workflow_version)
    # A new trace if the coordinator traces: no caller's span to continue.
    start = runs.Start(
        schedule_id=schedule.id,
        schedule_tick=tick,
        leader_epoch=epoch,
        trace=RunTrace.begin(None),
    )
    started = await runs.start(conn, workflow, schedule.input, None, by, start=start)
    await conn.execute(Q["set_tick_run"], schedule.id, tick, started.run_id)
    return started.run_id


async def _fire_ticks(
    conn: Conn, schedule: locks.LockedSchedule, ticks: list[datetime], term: Term
) -> Fired:
    """Fires the schedule's due ticks in order under its overlap policy (the caller
    holds the term and the schedule's row)."""
    started: list[UUID] = []
    skipped = buffered = 0
    overlap: Overlap = schedule.overlap  # type: ignore[assignment]
    by = f"schedule:{schedule.name}"
    for tick in ticks:
        running = [row["id"] for row in await conn.fetch(Q["running_runs"], schedule.id)]
        waiting = await conn.fetchval(Q["buffered_tick"], schedule.id) is not None
        decision = decide_overlap(overlap, bool(running), waiting)
        inserted = await conn.fetchval(
            Q["insert_fenced_tick"], schedule.id, tick, decision.outcome, term.holder, term.epoch
        )
        if inserted is None:
            continue  # a trigger or backfill fired this instant already
        if decision.outcome == "skipped":
            skipped += 1
        elif decision.outcome == "buffered":
            buffered += 1
        else:
            for run_id in running if decision.cancel_running else []:
                await runs.request_cancel(conn, run_id, f"overlap: tick {tick.isoformat()}", by)
            started.append(await _start_run(conn, schedule, tick, by, term.epoch))
    return Fired(started, skipped, buffered)


async def fire_due(conn: Conn, term: Term, limit: int = 100) -> Fired:
    """The coordinator's step: fires the due ticks of up to `limit` schedules (stopping
    once `limit` ticks have fired), and starts buffered ticks whose previous run has
    ended, in one transaction that writes only while `term` leads (Superseded
    otherwise)."""
    candidates = [row["id"] for row in await conn.fetch(Q["due"], limit)]
    if not candidates:
        return Fired()
    fired = Fired()
    async with transaction(conn, term):
        now = await _now(conn)
        for schedule in await locks.schedules(conn, candidates, skip_locked=True):
            if fired.ticks >= limit:
                break  # the rest in the next pass, which starts at once: keep this short
            by = f"schedule:{schedule.name}"
            # A buffered tick has fired: it starts its run even if paused since.
            waiting = await conn.fetchval(Q["buffered_tick"], schedule.id)
            if waiting is not None and not await conn.fetch(Q["running_runs"], schedule.id):
                run_id = await _start_run(conn, schedule, waiting, by, term.epoch)
                fired = dataclasses.replace(
                    fired,
                    started=[*fired.started, run_id],
                    buffered_started=fired.buffered_started + 1,
                )
            if schedule.paused or schedule.next_tick_at > now:
                continue
            due = plan(
                _cadence_of(schedule),
                schedule.next_tick_at,
                now,
                schedule.catchup,  # type: ignore[arg-type]
                schedule.catchup_window_ms,
            )
            more = await _fire_ticks(conn, schedule, due.fire, term)
            await conn.execute(Q["advance"], schedule.id, due.next_tick)
            fired = Fired(
                fired.started + more.started,
                fired.skipped + more.skipped,
                fired.buffered + more.buffered,
                fired.buffered_started,
            )
    return fired


async def trigger(conn: Conn, name: str, by: str) -> tuple[UUID, datetime]:
    """Starts a run now as a tick of the schedule (source 'trigger'), whatever its
    overlap policy and even while it is paused: the caller asked for this run."""
    async with conn.transaction():
        schedule = await _lock(conn, name)
        tick = await _now(conn)
        await conn.fetchval(Q["insert_requested_tick"], schedule.id, tick, "trigger")
        return await _start_run(conn, schedule, tick, by, None), tick


@dataclass(frozen=True, slots=True)
class Backfilled:
    started: list[UUID]
    # Ticks of the range that had fired already (by the schedule or an earlier backfill).
    already: int


async def backfill(conn: Conn, name: str, start: datetime, end: datetime, by: str) -> Backfilled:
    """Fires every tick in [start, end] that has not fired yet (source 'backfill'), all
    at once whatever the overlap policy; the range must be past and hold at most
    MAX_BACKFILL_TICKS ticks."""
    if end < start:
        raise invalid("end_time", "must not be before start_time")
    async with conn.transaction():
        schedule = await _lock(conn, name)
        if end > await _now(conn):
            raise invalid("end_time", "must be in the past (future ticks fire on their own)")
        ticks = _cadence_of(schedule).between(start, end, MAX_BACKFILL_TICKS + 1)
        if len(ticks) > MAX_BACKFILL_TICKS:
            raise invalid(
                "start_time", f"the range holds more than {MAX_BACKFILL_TICKS} ticks: split it"
            )
        started: list[UUID] = []
        for tick in ticks:
            inserted = await conn.fetchval(
                Q["insert_requested_tick"], schedule.id, tick, "backfill"
            )
            if inserted is not None:
                started.append(await _start_run(conn, schedule, tick, by, None))
    return Backfilled(started, len(ticks) - len(started))
