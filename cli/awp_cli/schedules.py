"""`awp schedule ...`: create, list, show, update, pause, resume, delete, trigger and
backfill schedules (docs/schedules.md). Plain calls of ControlService's schedule RPCs;
the server checks every field (a bad cron expression or zone comes back naming it).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from google.protobuf import duration_pb2, timestamp_pb2
from rich.table import Table

from awp.v1 import schedule_pb2
from awp_cli import render
from awp_cli.client import Client
from awp_cli.commands import json_object, workflow_ref
from awp_cli.errors import CliError, Exit
from awp_common import flags

Handler = Callable[[Client, argparse.Namespace], Awaitable[Exit]]
Add = Callable[..., argparse.ArgumentParser]

OVERLAPS = {
    "skip": schedule_pb2.OVERLAP_POLICY_SKIP,
    "buffer-one": schedule_pb2.OVERLAP_POLICY_BUFFER_ONE,
    "allow-all": schedule_pb2.OVERLAP_POLICY_ALLOW_ALL,
    "cancel-previous": schedule_pb2.OVERLAP_POLICY_CANCEL_PREVIOUS,
}
CATCHUPS = {
    "none": schedule_pb2.CATCHUP_POLICY_NONE,
    "last": schedule_pb2.CATCHUP_POLICY_LAST,
    "all": schedule_pb2.CATCHUP_POLICY_ALL,
}


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], add: Add) -> None:
    group = commands.add_parser(
        "schedule", aliases=["schedules"], help="start workflows on a clock (cron or interval)"
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = add(actions, "create", schedule_create, "create a schedule")
    update = add(actions, "update", schedule_update, "replace a schedule's definition")
    for sub in (create, update):
        sub.add_argument("name", metavar="NAME")
        sub.add_argument("workflow", type=workflow_ref, help="NAME or NAME@VERSION (none: latest)")
        cadence = sub.add_mutually_exclusive_group(required=True)
        cadence.add_argument("--cron", help='five-field cron expression, e.g. "0 2 * * *"')
        cadence.add_argument(
            "--every",
            type=flags.positive_duration,
            metavar="DURATION",
            help="an interval, e.g. 15m",
        )
        sub.add_argument("--timezone", default="", help="IANA zone of --cron (default UTC)")
        sub.add_argument("--input", type=json_object, help="run input: a JSON object, or @FILE")
        sub.add_argument("--overlap", choices=OVERLAPS, default="skip")
        sub.add_argument("--catchup", choices=CATCHUPS, default="all")
        sub.add_argument(
            "--catchup-window",
            type=flags.positive_duration,
            metavar="DURATION",
            help="how late a missed tick may still fire (default 1m)",
        )
        sub.add_argument("--paused", action="store_true", help="create it paused")
    add(actions, "list", schedule_list, "list schedules with their next fire times")
    for name, handler, text in (
        ("get", schedule_get, "show a schedule and its newest ticks"),
        ("pause", schedule_pause, "stop firing ticks until resumed"),
        ("resume", schedule_resume, "fire again from the next tick"),
        ("delete", schedule_delete, "delete a schedule (its runs stay)"),
        ("trigger", schedule_trigger, "start a run now as a tick of the schedule"),
    ):
        add(actions, name, handler, text).add_argument("name", metavar="NAME")
    backfill = add(
        actions, "backfill", schedule_backfill, "fire every tick of a past range not fired yet"
    )
    backfill.add_argument("name", metavar="NAME")
    backfill.add_argument("--start", type=_instant, required=True, help="ISO 8601 time")
    backfill.add_argument("--end", type=_instant, required=True, help="ISO 8601 time")


def _instant(text: str) -> timestamp_pb2.Timestamp:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time, got {text!r}") from None
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
    return value


def _duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromMilliseconds(round(seconds * 1000))
    return value


def _spec(args: argparse.Namespace) -> schedule_pb2.ScheduleSpec:
    name, version = args.workflow
    spec = schedule_pb2.ScheduleSpec(
        name=args.name,
        workflow_name=name,
        workflow_version=version,
        cron=args.cron or "",
        timezone=args.timezone,
        overlap=OVERLAPS[args.overlap],
        catchup=CATCHUPS[args.catchup],
        paused=args.paused,
    )
    if args.input is not None:
        spec.input.CopyFrom(args.input)
    if args.every is not None:
        spec.interval.CopyFrom(_duration(args.every))
    if args.catchup_window is not None:
        spec.catchup_window.CopyFrom(_duration(args.catchup_window))
    return spec


def _cadence(spec: schedule_pb2.ScheduleSpec) -> str:
    if spec.cron:
        return f"{spec.cron} ({spec.timezone})"
    return f"every {spec.interval.ToTimedelta()}"


def _table(found: list[schedule_pb2.Schedule]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "WORKFLOW", "CADENCE", "OVERLAP", "NEXT FIRE"):
        table.add_column(column)
    for schedule in found:
        spec = schedule.spec
        version = f"@{spec.workflow_version}" if spec.workflow_version else ""
        table.add_row(
            spec.name,
            spec.workflow_name + version,
            _cadence(spec),
            schedule_pb2.OverlapPolicy.Name(spec.overlap).removeprefix("OVERLAP_POLICY_").lower(),
            "paused" if spec.paused else render.local_time(schedule.next_fire_time),
        )
    return table


def _show(answer: schedule_pb2.Schedule, args: argparse.Namespace) -> None:
    if args.json:
        render.print_json(answer)
        return
    render.stdout.print(_table([answer]))
    if answer.recent_ticks:
        ticks = Table(box=None, header_style="bold", title="newest ticks")
        for column in ("TICK", "SOURCE", "OUTCOME", "RUN", "EPOCH"):
            ticks.add_column(column)
        for tick in answer.recent_ticks:
            ticks.add_row(
                render.local_time(tick.tick_time),
                tick.source,
                tick.outcome,
                tick.run_id,
                str(tick.leader_epoch or ""),
            )
        render.stdout.print(ticks)


async def schedule_create(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.CreateSchedule, schedule_pb2.CreateScheduleRequest(schedule=_spec(args))
    )
    _show(answer.schedule, args)
    return Exit.OK


async def schedule_update(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.UpdateSchedule, schedule_pb2.UpdateScheduleRequest(schedule=_spec(args))
    )
    _show(answer.schedule, args)
    return Exit.OK


async def schedule_list(client: Client, args: argparse.Namespace) -> Exit:
    found: list[schedule_pb2.Schedule] = []
    request = schedule_pb2.ListSchedulesRequest()
    while True:
        answer = await client.call(client.control.ListSchedules, request)
        found.extend(answer.schedules)
        if not answer.next_page_token:
            break
        request.page_token = answer.next_page_token
    if args.json:
        render.print_json(schedule_pb2.ListSchedulesResponse(schedules=found))
    elif not found:
        render.stdout.print("no schedules")
    else:
        render.stdout.print(_table(found))
    return Exit.OK


async def schedule_get(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.GetSchedule, schedule_pb2.GetScheduleRequest(name=args.name)
    )
    _show(answer.schedule, args)
    return Exit.OK


async def schedule_pause(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.PauseSchedule, schedule_pb2.PauseScheduleRequest(name=args.name)
    )
    _show(answer.schedule, args)
    return Exit.OK


async def schedule_resume(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.ResumeSchedule, schedule_pb2.ResumeScheduleRequest(name=args.name)
    )
    _show(answer.schedule, args)
    return Exit.OK


async def schedule_delete(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.DeleteSchedule, schedule_pb2.DeleteScheduleRequest(name=args.name)
    )
    if args.json:
        render.print_json(answer)
    else:
        render.stdout.print(f"deleted schedule {args.name}")
    return Exit.OK


async def schedule_trigger(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.TriggerSchedule, schedule_pb2.TriggerScheduleRequest(name=args.name)
    )
    if args.json:
        render.print_json(answer)
    else:
        render.stdout.print(answer.run_id)
    return Exit.OK


async def schedule_backfill(client: Client, args: argparse.Namespace) -> Exit:
    if args.end.ToDatetime() < args.start.ToDatetime():
        raise CliError(Exit.USAGE, "--end is before --start")
    answer = await client.call(
        client.control.BackfillSchedule,
        schedule_pb2.BackfillScheduleRequest(
            name=args.name, start_time=args.start, end_time=args.end
        ),
    )
    if args.json:
        render.print_json(answer)
    else:
        for run_id in answer.run_ids:
            render.stdout.print(run_id)
        render.stderr.print(
            f"started {len(answer.run_ids)} runs; {answer.already_fired} ticks had fired already"
        )
    return Exit.OK
