"""The schedule RPCs over real gRPC and PostgreSQL: create, get, list, update, pause,
resume, delete, trigger and backfill; bad cron expressions, zones and policies refused
naming the field; StartRun's delayed start. (Firing ticks: the coordinator's tests.)"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from awp.v1 import control_pb2_grpc, runs_pb2, schedule_pb2, types_pb2
from awp_db.connect import Pool
from awp_protocol.errors import Reason
from control.helpers import create_workflow, start_run, task
from kit import expect_error
from kit.invariants.schedules import check_schedule_ticks

Stub = control_pb2_grpc.ControlServiceStub


def nightly(**fields: object) -> schedule_pb2.ScheduleSpec:
    values: dict[str, object] = {
        "name": "nightly",
        "workflow_name": "wf",
        "cron": "0 2 * * *",
        "timezone": "Europe/Paris",
    }
    values.update(fields)
    return schedule_pb2.ScheduleSpec(**values)  # type: ignore[arg-type]


def at(moment: datetime) -> timestamp_pb2.Timestamp:
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


async def test_a_schedule_is_created_read_listed_changed_paused_and_deleted(
    control: Stub,
) -> None:
    await create_workflow(control, tasks=[task("a")])
    created = (
        await control.CreateSchedule(schedule_pb2.CreateScheduleRequest(schedule=nightly()))
    ).schedule
    assert created.spec.overlap == schedule_pb2.OVERLAP_POLICY_SKIP
    assert created.spec.catchup == schedule_pb2.CATCHUP_POLICY_ALL
    assert created.spec.catchup_window.seconds == 60
    fire = created.next_fire_time.ToDatetime(tzinfo=UTC)
    # 02:00 in Paris is 00:00 or 01:00 UTC, depending on the season.
    assert fire.minute == 0 and fire.hour in (0, 1) and fire > datetime.now(UTC)
    error = await expect_error(
        control.CreateSchedule(schedule_pb2.CreateScheduleRequest(schedule=nightly()))
    )
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, Reason.SCHEDULE_EXISTS)

    got = (await control.GetSchedule(schedule_pb2.GetScheduleRequest(name="nightly"))).schedule
    assert got.id == created.id and got.spec.cron == "0 2 * * *"
    await control.CreateSchedule(
        schedule_pb2.CreateScheduleRequest(
            schedule=nightly(name="often", cron="", interval=duration_pb2.Duration(seconds=900))
        )
    )
    page = await control.ListSchedules(schedule_pb2.ListSchedulesRequest(page_size=1))
    assert [s.spec.name for s in page.schedules] == ["nightly"]
    rest = await control.ListSchedules(
        schedule_pb2.ListSchedulesRequest(page_token=page.next_page_token)
    )
    assert [s.spec.name for s in rest.schedules] == ["often"]
    assert rest.schedules[0].spec.interval.seconds == 900

    updated = (
        await control.UpdateSchedule(
            schedule_pb2.UpdateScheduleRequest(schedule=nightly(cron="30 6 * * 1-5"))
        )
    ).schedule
    assert updated.spec.cron == "30 6 * * 1-5"
    paused = await control.PauseSchedule(schedule_pb2.PauseScheduleRequest(name="nightly"))
    assert paused.schedule.spec.paused and not paused.schedule.HasField("next_fire_time")
    resumed = await control.ResumeSchedule(schedule_pb2.ResumeScheduleRequest(name="nightly"))
    assert not resumed.schedule.spec.paused and resumed.schedule.HasField("next_fire_time")

    await control.DeleteSchedule(schedule_pb2.DeleteScheduleRequest(name="nightly"))
    error = await expect_error(control.GetSchedule(schedule_pb2.GetScheduleRequest(name="nightly")))
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, Reason.SCHEDULE_NOT_FOUND)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "0 25 * * *"}, "cron"),
        ({"cron": "every night"}, "cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"cron": "", "interval": duration_pb2.Duration(nanos=5_000_000)}, "interval"),
        ({"cron": "", "interval": None}, "cron"),
        ({"overlap": 9}, "overlap"),
        ({"name": "no spaces"}, "name"),
        ({"workflow_name": "missing"}, None),
    ],
)
async def test_bad_schedules_are_refused_naming_the_field(
    control: Stub, fields: dict[str, object], field: str | None
) -> None:
    await create_workflow(control, tasks=[task("a")])
    error = await expect_error(
        control.CreateSchedule(schedule_pb2.CreateScheduleRequest(schedule=nightly(**fields)))
    )
    if field is None:
        assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, Reason.WORKFLOW_NOT_FOUND)
    else:
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert error.fields == [field], error.message


async def test_trigger_and_backfill_fire_each_tick_once(control: Stub, pool: Pool) -> None:
    await create_workflow(control, tasks=[task("a")])
    await control.CreateSchedule(
        schedule_pb2.CreateScheduleRequest(
            schedule=nightly(name="hourly", cron="0 * * * *", timezone="")
        )
    )
    triggered = await control.TriggerSchedule(schedule_pb2.TriggerScheduleRequest(name="hourly"))
    run = (await control.GetRun(runs_pb2.GetRunRequest(run_id=triggered.run_id))).run
    assert run.schedule_tick == triggered.tick_time and run.schedule_id

    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=4)
    first = await control.BackfillSchedule(
        schedule_pb2.BackfillScheduleRequest(name="hourly", start_time=at(start), end_time=at(end))
    )
    assert (len(first.run_ids), first.already_fired) == (5, 0)
    ticks = []
    for run_id in first.run_ids:
        got = (await control.GetRun(runs_pb2.GetRunRequest(run_id=run_id))).run
        ticks.append(got.schedule_tick.ToDatetime(tzinfo=UTC))
    assert ticks == [start + timedelta(hours=h) for h in range(5)]
    # Overlapping the first: only the new ticks fire.
    again = await control.BackfillSchedule(
        schedule_pb2.BackfillScheduleRequest(
            name="hourly", start_time=at(start - timedelta(hours=2)), end_time=at(end)
        )
    )
    assert (len(again.run_ids), again.already_fired) == (2, 5)
    error = await expect_error(
        control.BackfillSchedule(
            schedule_pb2.BackfillScheduleRequest(
                name="hourly", start_time=at(start), end_time=at(end + timedelta(days=1))
            )
        )
    )
    assert error.fields == ["end_time"]
    await check_schedule_ticks(pool)


async def test_a_delayed_start_is_visible_at_once_with_its_start_time(control: Stub) -> None:
    await create_workflow(control, tasks=[task("a")])
    later = datetime.now(UTC) + timedelta(hours=1)
    run = await start_run(control, start_time=at(later))
    # The run exists (and is cancelable) at once; its root waits for the start time.
    assert run.state == types_pb2.RUN_STATE_RUNNING
    assert abs(run.start_time.ToDatetime(tzinfo=UTC) - later) < timedelta(milliseconds=1)
    assert [(c.state, c.count) for c in run.tasks_by_state] == [(types_pb2.TASK_STATE_PENDING, 1)]
    delayed = await start_run(control, start_delay=duration_pb2.Duration(seconds=30))
    assert delayed.HasField("start_time")
    error = await expect_error(
        start_run(control, start_time=at(later), start_delay=duration_pb2.Duration(seconds=30))
    )
    assert error.fields == ["start_delay"]


async def test_the_fire_path_across_dst_nights_in_new_york(control: Stub, pool: Pool) -> None:
    """Backfills create ticks and runs through the same calendar the coordinator fires
    by: the runs' ticks over a spring-forward and a fall-back night."""
    await create_workflow(control, tasks=[task("a")])
    for name, cron in (("daily-0230", "30 2 * * *"), ("daily-0130", "30 1 * * *")):
        await control.CreateSchedule(
            schedule_pb2.CreateScheduleRequest(
                schedule=nightly(name=name, cron=cron, timezone="America/New_York")
            )
        )
    await control.CreateSchedule(
        schedule_pb2.CreateScheduleRequest(
            schedule=nightly(name="half-hourly", cron="*/30 * * * *", timezone="America/New_York")
        )
    )

    async def ticks(name: str, start: datetime, end: datetime) -> list[datetime]:
        answer = await control.BackfillSchedule(
            schedule_pb2.BackfillScheduleRequest(name=name, start_time=at(start), end_time=at(end))
        )
        found = [
            (await control.GetRun(runs_pb2.GetRunRequest(run_id=r))).run.schedule_tick
            for r in answer.run_ids
        ]
        return [t.ToDatetime(tzinfo=UTC) for t in found]

    # 2025-03-09: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist and fires at 03:00.
    spring = await ticks(
        "daily-0230", datetime(2025, 3, 8, tzinfo=UTC), datetime(2025, 3, 11, tzinfo=UTC)
    )
    assert spring == [
        datetime(2025, 3, 8, 7, 30, tzinfo=UTC),
        datetime(2025, 3, 9, 7, 0, tzinfo=UTC),
        datetime(2025, 3, 10, 6, 30, tzinfo=UTC),
    ]
    # 2025-11-02: 02:00 EDT goes back to 01:00 EST; the daily 01:30 fires once that day.
    fall = await ticks(
        "daily-0130", datetime(2025, 11, 1, tzinfo=UTC), datetime(2025, 11, 4, tzinfo=UTC)
    )
    assert fall == [
        datetime(2025, 11, 1, 5, 30, tzinfo=UTC),
        datetime(2025, 11, 2, 5, 30, tzinfo=UTC),
        datetime(2025, 11, 3, 6, 30, tzinfo=UTC),
    ]
    # Every 30 minutes stays every 30 minutes of real time through the repeated hour.
    half = await ticks(
        "half-hourly",
        datetime(2025, 11, 2, 4, 30, tzinfo=UTC),
        datetime(2025, 11, 2, 7, 0, tzinfo=UTC),
    )
    assert len(half) == 6
    assert {b - a for a, b in itertools.pairwise(half)} == {timedelta(minutes=30)}
    await check_schedule_ticks(pool)
