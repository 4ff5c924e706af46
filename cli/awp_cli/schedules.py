"""`awp schedule ...`: create, list, show, update, pause, resume, delete, trigger and
backfill schedules (docs/schedules.md), through the SDK's awp_sdk.schedules. The server
checks every field (a bad cron expression or zone comes back naming it); --json prints
the answer through awp_sdk.wire, as every other command does.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta

from rich.table import Table

from awp_cli import render
from awp_cli.commands import json_object, workflow_ref
from awp_cli.errors import CliError, Exit
from awp_common import flags
from awp_sdk import wire
from awp_sdk.client import AsyncClient
from awp_sdk.enums import CatchupPolicy, OverlapPolicy
from awp_sdk.records import Schedule
from awp_sdk.schedules import Schedules

Handler = Callable[[AsyncClient, argparse.Namespace], Awaitable[Exit]]
Add = Callable[..., argparse.ArgumentParser]


def _choice(policy: OverlapPolicy | CatchupPolicy) -> str:
    """A policy as the command line spells it ("buffer-one")."""
    return policy.value.replace("_", "-")


OVERLAPS = {_choice(policy): policy for policy in OverlapPolicy}
CATCHUPS = {_choice(policy): policy for policy in CatchupPolicy}


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
        sub.add_argument("--overlap", choices=OVERLAPS, default=_choice(OverlapPolicy.SKIP))
        sub.add_argument("--catchup", choices=CATCHUPS, default=_choice(CatchupPolicy.ALL))
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


def _instant(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time, got {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _span(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


async def _define(client: AsyncClient, args: argparse.Namespace, *, create: bool) -> Schedule:
    schedules = Schedules(client)
    call = schedules.create if create else schedules.update
    name, version = args.workflow
    return await call(
        args.name,
        name,
        cron=args.cron,
        every=_span(args.every),
        # Empty: the server's default zone (UTC).
        timezone=args.timezone,
        input=args.input,
        version=version,
        overlap=OVERLAPS[args.overlap],
        catchup=CATCHUPS[args.catchup],
        catchup_window=_span(args.catchup_window),
        paused=args.paused,
    )


def _table(found: Iterable[Schedule]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "WORKFLOW", "CADENCE", "OVERLAP", "NEXT FIRE"):
        table.add_column(column)
    for schedule in found:
        table.add_row(
            schedule.name,
            # Version 0: the latest at each tick.
            schedule.workflow + (f"@{schedule.version}" if schedule.version else ""),
            schedule.cadence,
            schedule.overlap.value,
            "paused" if schedule.paused else render.local_time(schedule.next_fire_at),
        )
    return table


def _show(schedule: Schedule, args: argparse.Namespace) -> Exit:
    if args.json:
        render.print_json(wire.schedule(schedule))
        return Exit.OK
    render.stdout.print(_table([schedule]))
    if schedule.recent_ticks:
        ticks = Table(box=None, header_style="bold", title="newest ticks")
        for column in ("TICK", "SOURCE", "OUTCOME", "RUN", "EPOCH"):
            ticks.add_column(column)
        for tick in schedule.recent_ticks:
            ticks.add_row(
                render.local_time(tick.at),
                tick.source,
                tick.outcome,
                tick.run_id or "",
                str(tick.leader_epoch or ""),
            )
        render.stdout.print(ticks)
    return Exit.OK


async def schedule_create(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await _define(client, args, create=True), args)


async def schedule_update(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await _define(client, args, create=False), args)


async def schedule_list(client: AsyncClient, args: argparse.Namespace) -> Exit:
    found = await Schedules(client).list()
    if args.json:
        render.print_json(wire.schedules(found))
    elif not found:
        render.stdout.print("no schedules")
    else:
        render.stdout.print(_table(found))
    return Exit.OK


async def schedule_get(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await Schedules(client).get(args.name), args)


async def schedule_pause(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await Schedules(client).pause(args.name), args)


async def schedule_resume(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await Schedules(client).resume(args.name), args)


async def schedule_delete(client: AsyncClient, args: argparse.Namespace) -> Exit:
    await Schedules(client).delete(args.name)
    if args.json:
        render.print_json(wire.schedule_deleted())
    else:
        render.stdout.print(f"deleted schedule {args.name}")
    return Exit.OK


async def schedule_trigger(client: AsyncClient, args: argparse.Namespace) -> Exit:
    handle = await Schedules(client).trigger(args.name)
    if args.json:
        # The answer's tick is the run's: one GetRun reads it back.
        render.print_json(wire.triggered((await handle.get(outputs=False)).run))
    else:
        render.stdout.print(handle.id)
    return Exit.OK


async def schedule_backfill(client: AsyncClient, args: argparse.Namespace) -> Exit:
    if args.end < args.start:
        raise CliError(Exit.USAGE, "--end is before --start")
    run_ids, already_fired = await Schedules(client).backfill(args.name, args.start, args.end)
    if args.json:
        render.print_json(wire.backfilled(run_ids, already_fired))
    else:
        for run_id in run_ids:
            render.stdout.print(run_id)
        render.stderr.print(f"started {len(run_ids)} runs; {already_fired} ticks had fired already")
    return Exit.OK
