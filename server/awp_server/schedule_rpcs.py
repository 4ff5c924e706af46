"""ControlService's schedule RPCs (protos/awp/v1/schedule.proto, docs/schedules.md).

Kept apart from control_service.py, whose handlers and checks they reuse: a schedule is
checked and stored by awp_db.schedules (the calendar's rules are awp_kernel.schedules);
here are only the wire conversions and the audit trail.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from google.protobuf import duration_pb2, timestamp_pb2

from awp.v1 import schedule_pb2
from awp_db import schedules
from awp_kernel.errors import invalid
from awp_kernel.schedules import CATCHUPS as CATCHUP_NAMES
from awp_kernel.schedules import DEFAULT_CATCHUP_WINDOW_MS, DEFAULT_TIMEZONE
from awp_kernel.schedules import OVERLAPS as OVERLAP_NAMES
from awp_protocol.jsonvalue import dict_to_struct
from awp_protocol.limits import MAX_PAGE_SIZE
from awp_protocol.names import NAME_PATTERN
from awp_server import control_requests as requests
from awp_server import convert
from awp_server.auth import caller
from awp_server.control_service import Context, ControlService
from awp_server.errors import unary

SCHEDULES_PAGE: Final = (100, MAX_PAGE_SIZE)
RECENT_TICKS: Final = 20

# Storage names <-> the proto enums (awp_kernel.schedules holds the names).
OVERLAPS: Final = convert.enum_map(schedule_pb2.OverlapPolicy, "OVERLAP_POLICY_", OVERLAP_NAMES)
CATCHUPS: Final = convert.enum_map(schedule_pb2.CatchupPolicy, "CATCHUP_POLICY_", CATCHUP_NAMES)


def _ms(value: duration_pb2.Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def spec_from_proto(spec: schedule_pb2.ScheduleSpec) -> schedules.ScheduleSpec:
    """Wire to storage; the calendar's checks are awp_db.schedules' (naming each field)."""
    requests.check_name("name", spec.name)
    requests.check_name("workflow_name", spec.workflow_name)
    requests.check_version("workflow_version", spec.workflow_version)
    interval_ms = _ms(spec.interval) if spec.HasField("interval") else 0
    if spec.HasField("interval") and interval_ms <= 0:
        raise invalid("interval", "must be positive")
    window_ms = (
        _ms(spec.catchup_window) if spec.HasField("catchup_window") else DEFAULT_CATCHUP_WINDOW_MS
    )
    # Unspecified: the defaults the proto states; an unknown number is refused.
    overlap = OVERLAPS.name(spec.overlap) or ("skip" if not spec.overlap else "")
    catchup = CATCHUPS.name(spec.catchup) or ("all" if not spec.catchup else "")
    if not overlap:
        raise invalid("overlap", f"{spec.overlap} is not an OverlapPolicy")
    if not catchup:
        raise invalid("catchup", f"{spec.catchup} is not a CatchupPolicy")
    return schedules.ScheduleSpec(
        name=spec.name,
        workflow_name=spec.workflow_name,
        workflow_version=spec.workflow_version,
        input=requests.json_object("input", spec.input),
        cron=spec.cron,
        interval_ms=interval_ms,
        timezone=spec.timezone or DEFAULT_TIMEZONE,
        overlap=overlap,
        catchup=catchup,
        catchup_window_ms=window_ms,
        paused=spec.paused,
    )


def schedule_to_proto(
    row: schedules.ScheduleRow, ticks: list[schedules.TickRow] | None = None
) -> schedule_pb2.Schedule:
    spec = schedule_pb2.ScheduleSpec(
        name=row.name,
        workflow_name=row.workflow_name,
        workflow_version=row.workflow_version,
        input=dict_to_struct(row.input),
        cron=row.cron or "",
        timezone=row.timezone,
        overlap=OVERLAPS.proto(row.overlap),
        catchup=CATCHUPS.proto(row.catchup),
        catchup_window=convert.duration_from_ms(row.catchup_window_ms),
        paused=row.paused,
    )
    if row.interval_ms is not None:
        spec.interval.CopyFrom(convert.duration_from_ms(row.interval_ms))
    return schedule_pb2.Schedule(
        spec=spec,
        id=str(row.id),
        next_fire_time=None if row.paused else convert.timestamp(row.next_tick_at),
        created_at=convert.timestamp(row.created_at),
        created_by=row.created_by,
        updated_at=convert.timestamp(row.updated_at),
        updated_by=row.updated_by,
        recent_ticks=[
            schedule_pb2.ScheduleTick(
                tick_time=convert.timestamp(tick.tick_at),
                source=tick.source,
                outcome=tick.outcome,
                run_id="" if tick.run_id is None else str(tick.run_id),
                leader_epoch=tick.leader_epoch or 0,
                created_at=convert.timestamp(tick.created_at),
            )
            for tick in ticks or []
        ],
    )


def _instant(field: str, value: timestamp_pb2.Timestamp, present: bool) -> datetime:
    if not present:
        raise invalid(field, "is required")
    return convert.instant(field, value)


class ControlServiceWithSchedules(ControlService):
    """ControlService, schedule RPCs included: what awp-server serves."""

    def _name(self, name: str) -> str:
        requests.check_name("name", name)
        return name

    @unary
    async def CreateSchedule(
        self, request: schedule_pb2.CreateScheduleRequest, context: Context
    ) -> schedule_pb2.CreateScheduleResponse:
        spec = spec_from_proto(request.schedule)
        async with self._pool.acquire() as conn:
            row = await schedules.create(conn, spec, caller())
        requests.audit("CreateSchedule", schedule=spec.name, workflow=spec.workflow_name)
        return schedule_pb2.CreateScheduleResponse(schedule=schedule_to_proto(row))

    @unary
    async def GetSchedule(
        self, request: schedule_pb2.GetScheduleRequest, context: Context
    ) -> schedule_pb2.GetScheduleResponse:
        row = await schedules.get(self._pool, self._name(request.name))
        ticks = await schedules.recent_ticks(self._pool, row.id, RECENT_TICKS)
        return schedule_pb2.GetScheduleResponse(schedule=schedule_to_proto(row, ticks))

    @unary
    async def ListSchedules(
        self, request: schedule_pb2.ListSchedulesRequest, context: Context
    ) -> schedule_pb2.ListSchedulesResponse:
        size = requests.page_size(request.page_size, *SCHEDULES_PAGE)
        after = ""
        if request.page_token:
            (after,) = requests.decode_token(request.page_token, "s", (str,))
            if not NAME_PATTERN.fullmatch(after):
                raise requests.bad_token()
        found = await schedules.list_page(self._pool, after, size + 1)
        page = found[:size]
        token = requests.encode_token("s", [page[-1].name]) if len(found) > size else ""
        return schedule_pb2.ListSchedulesResponse(
            schedules=[schedule_to_proto(row) for row in page], next_page_token=token
        )

    @unary
    async def UpdateSchedule(
        self, request: schedule_pb2.UpdateScheduleRequest, context: Context
    ) -> schedule_pb2.UpdateScheduleResponse:
        spec = spec_from_proto(request.schedule)
        async with self._pool.acquire() as conn:
            row = await schedules.update(conn, spec, caller())
        requests.audit("UpdateSchedule", schedule=spec.name, workflow=spec.workflow_name)
        return schedule_pb2.UpdateScheduleResponse(schedule=schedule_to_proto(row))

    @unary
    async def PauseSchedule(
        self, request: schedule_pb2.PauseScheduleRequest, context: Context
    ) -> schedule_pb2.PauseScheduleResponse:
        async with self._pool.acquire() as conn:
            row = await schedules.set_paused(conn, self._name(request.name), True, caller())
        requests.audit("PauseSchedule", schedule=row.name)
        return schedule_pb2.PauseScheduleResponse(schedule=schedule_to_proto(row))

    @unary
    async def ResumeSchedule(
        self, request: schedule_pb2.ResumeScheduleRequest, context: Context
    ) -> schedule_pb2.ResumeScheduleResponse:
        async with self._pool.acquire() as conn:
            row = await schedules.set_paused(conn, self._name(request.name), False, caller())
        requests.audit("ResumeSchedule", schedule=row.name)
        return schedule_pb2.ResumeScheduleResponse(schedule=schedule_to_proto(row))

    @unary
    async def DeleteSchedule(
        self, request: schedule_pb2.DeleteScheduleRequest, context: Context
    ) -> schedule_pb2.DeleteScheduleResponse:
        await schedules.delete(self._pool, self._name(request.name))
        requests.audit("DeleteSchedule", schedule=request.name)
        return schedule_pb2.DeleteScheduleResponse()

    @unary
    async def TriggerSchedule(
        self, request: schedule_pb2.TriggerScheduleRequest, context: Context
    ) -> schedule_pb2.TriggerScheduleResponse:
        async with self._pool.acquire() as conn:
            run_id, tick = await schedules.trigger(conn, self._name(request.name), caller())
        requests.audit("TriggerSchedule", schedule=request.name, run_id=run_id)
        return schedule_pb2.TriggerScheduleResponse(
            run_id=str(run_id), tick_time=convert.timestamp(tick)
        )

    @unary
    async def BackfillSchedule(
        self, request: schedule_pb2.BackfillScheduleRequest, context: Context
    ) -> schedule_pb2.BackfillScheduleResponse:
        name = self._name(request.name)
        start = _instant("start_time", request.start_time, request.HasField("start_time"))
        end = _instant("end_time", request.end_time, request.HasField("end_time"))
        async with self._pool.acquire() as conn:
            done = await schedules.backfill(conn, name, start, end, caller())
        requests.audit(
            "BackfillSchedule", schedule=name, started=len(done.started), already=done.already
        )
        return schedule_pb2.BackfillScheduleResponse(
            run_ids=[str(run_id) for run_id in done.started], already_fired=done.already
        )
