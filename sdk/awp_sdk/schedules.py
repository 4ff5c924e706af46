"""Schedules and delayed starts from application code (docs/schedules.md).

    async with AsyncClient() as client:
        schedules = Schedules(client)
        await schedules.create("nightly", "digest", cron="0 2 * * *", timezone="Europe/Paris")
        for s in await schedules.list():
            print(s.name, s.next_fire_at)

A delayed start is AsyncClient.start's start_at / start_in.

Every check is the server's: a bad cron expression, zone or policy raises InvalidArgument
naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from awp.v1 import schedule_pb2
from awp_sdk import decode
from awp_sdk.client import AsyncClient
from awp_sdk.enums import CatchupPolicy, OverlapPolicy, encode
from awp_sdk.handle import AsyncRunHandle
from awp_sdk.records import Schedule
from awp_sdk.starts import json_input

# A policy by member or by its name ("buffer_one"); another name is InvalidArgument.
Overlap = OverlapPolicy | str
Catchup = CatchupPolicy | str


class Schedules:
    """The schedule calls of one AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def _spec(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None,
        every: timedelta | None,
        timezone: str,
        input: Mapping[str, Any] | None,
        version: int,
        overlap: Overlap,
        catchup: Catchup,
        catchup_window: timedelta | None,
        paused: bool,
    ) -> schedule_pb2.ScheduleSpec:
        spec = schedule_pb2.ScheduleSpec(
            name=name,
            workflow_name=workflow,
            workflow_version=version,
            input=json_input(input, "input"),
            cron=cron or "",
            timezone=timezone,
            overlap=encode(OverlapPolicy, overlap),  # type: ignore[arg-type]
            catchup=encode(CatchupPolicy, catchup),  # type: ignore[arg-type]
            paused=paused,
        )
        if every is not None:
            spec.interval.FromTimedelta(every)
        if catchup_window is not None:
            spec.catchup_window.FromTimedelta(catchup_window)
        return spec

    async def create(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        input: Mapping[str, Any] | None = None,
        version: int = 0,
        overlap: Overlap = OverlapPolicy.SKIP,
        catchup: Catchup = CatchupPolicy.ALL,
        catchup_window: timedelta | None = None,
        paused: bool = False,
    ) -> Schedule:
        """A schedule of `workflow` on a cron expression (in `timezone`) or `every`."""
        spec = self._spec(
            name, workflow, cron=cron, every=every, timezone=timezone, input=input,
            version=version, overlap=overlap, catchup=catchup, catchup_window=catchup_window,
            paused=paused,
        )  # fmt: skip
        answer = await self._client.call(
            self._client.control.CreateSchedule, schedule_pb2.CreateScheduleRequest(schedule=spec)
        )
        return decode.schedule(answer.schedule)

    async def update(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        timezone: str = "UTC",
        input: Mapping[str, Any] | None = None,
        version: int = 0,
        overlap: Overlap = OverlapPolicy.SKIP,
        catchup: Catchup = CatchupPolicy.ALL,
        catchup_window: timedelta | None = None,
        paused: bool = False,
    ) -> Schedule:
        """Replaces the whole definition; it fires from the next tick after now."""
        spec = self._spec(
            name, workflow, cron=cron, every=every, timezone=timezone, input=input,
            version=version, overlap=overlap, catchup=catchup, catchup_window=catchup_window,
            paused=paused,
        )  # fmt: skip
        answer = await self._client.call(
            self._client.control.UpdateSchedule, schedule_pb2.UpdateScheduleRequest(schedule=spec)
        )
        return decode.schedule(answer.schedule)

    async def get(self, name: str) -> Schedule:
        answer = await self._client.call(
            self._client.control.GetSchedule, schedule_pb2.GetScheduleRequest(name=name)
        )
        return decode.schedule(answer.schedule)

    async def list(self) -> list[Schedule]:
        """Every schedule, by name."""
        found: list[Schedule] = []
        request = schedule_pb2.ListSchedulesRequest()
        while True:
            answer = await self._client.call(self._client.control.ListSchedules, request)
            found.extend(map(decode.schedule, answer.schedules))
            if not answer.next_page_token:
                return found
            request.page_token = answer.next_page_token

    async def pause(self, name: str) -> Schedule:
        answer = await self._client.call(
            self._client.control.PauseSchedule, schedule_pb2.PauseScheduleRequest(name=name)
        )
        return decode.schedule(answer.schedule)

    async def resume(self, name: str) -> Schedule:
        answer = await self._client.call(
            self._client.control.ResumeSchedule, schedule_pb2.ResumeScheduleRequest(name=name)
        )
        return decode.schedule(answer.schedule)

    async def delete(self, name: str) -> None:
        await self._client.call(
            self._client.control.DeleteSchedule, schedule_pb2.DeleteScheduleRequest(name=name)
        )

    async def trigger(self, name: str) -> AsyncRunHandle:
        """Starts a run now as a tick of the schedule."""
        answer = await self._client.call(
            self._client.control.TriggerSchedule, schedule_pb2.TriggerScheduleRequest(name=name)
        )
        return self._client.run(answer.run_id)

    async def backfill(
        self, name: str, start: datetime, end: datetime
    ) -> tuple[tuple[str, ...], int]:
        """Fires every tick in [start, end] not fired yet: (the runs started, how many ticks
        of the range had fired already)."""
        request = schedule_pb2.BackfillScheduleRequest(name=name)
        request.start_time.FromDatetime(start)
        request.end_time.FromDatetime(end)
        answer = await self._client.call(self._client.control.BackfillSchedule, request)
        return tuple(answer.run_ids), answer.already_fired
