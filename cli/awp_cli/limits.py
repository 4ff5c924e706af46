"""`awp limits ...`: set, get and list rate limits and token budgets (docs/workflows.md,
"Rate limits and token budgets"), through the SDK's awp_sdk.limits; --json prints the
answer through awp_sdk.wire, as every other command does."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta

from rich.table import Table

from awp_cli import render
from awp_cli.errors import Exit
from awp_common import flags
from awp_sdk import wire
from awp_sdk.client import AsyncClient
from awp_sdk.limits import RateLimits
from awp_sdk.records import LimitsOverview, LimitWaiting, RateLimit

Handler = Callable[[AsyncClient, argparse.Namespace], Awaitable[Exit]]
Add = Callable[..., argparse.ArgumentParser]


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], add: Add) -> None:
    group = commands.add_parser(
        "limits", aliases=["limit"], help="rate limits and token budgets (units per period)"
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = add(actions, "set", limits_set, "create or change a limit: UNITS per --per")
    put.add_argument("name", metavar="NAME")
    put.add_argument("units", type=int, metavar="UNITS", help="units granted per period")
    put.add_argument(
        "--per",
        type=flags.positive_duration,
        required=True,
        metavar="DURATION",
        help="the period, e.g. 1m",
    )
    add(actions, "get", limits_get, "show a limit and its use now").add_argument(
        "name", metavar="NAME"
    )
    add(
        actions,
        "list",
        limits_list,
        "list every limit, its use and the ready tasks it holds back now, and the "
        "concurrency keys holding tasks back",
    )


def _table(found: Iterable[RateLimit], overview: LimitsOverview | None = None) -> Table:
    """The limits; with the overview (list only), how many ready tasks each holds back
    now."""
    table = Table(box=None, header_style="bold")
    columns = ["NAME", "UNITS", "PER", "USED NOW", "PAUSED UNTIL", "SET BY"]
    for column in columns + (["WAITING NOW"] if overview is not None else []):
        table.add_column(column)
    for limit in found:
        row = [
            limit.name,
            f"{limit.units:,}",
            render.took(limit.period.total_seconds() if limit.period else None),
            f"{limit.used:,}",
            render.local_time(limit.paused_until) if limit.paused_until else "",
            limit.updated_by,
        ]
        if overview is not None:
            row.append(f"{overview.waiting_for(limit.name):,}")
        table.add_row(*row)
    return table


def _keys_table(keys: Iterable[LimitWaiting]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("CONCURRENCY KEY")
    table.add_column("WAITING NOW")
    for key in keys:
        table.add_row(key.name, f"{key.waiting:,}")
    return table


def _show(limit: RateLimit, args: argparse.Namespace) -> Exit:
    if args.json:
        render.print_json(wire.rate_limit(limit))
    else:
        render.stdout.print(_table([limit]))
    return Exit.OK


async def limits_set(client: AsyncClient, args: argparse.Namespace) -> Exit:
    per = timedelta(seconds=args.per)
    return _show(await RateLimits(client).set(args.name, args.units, per=per), args)


async def limits_get(client: AsyncClient, args: argparse.Namespace) -> Exit:
    return _show(await RateLimits(client).get(args.name), args)


async def limits_list(client: AsyncClient, args: argparse.Namespace) -> Exit:
    overview = await RateLimits(client).overview()
    if args.json:
        render.print_json(wire.rate_limits(overview))
        return Exit.OK
    if overview.limits:
        render.stdout.print(_table(overview.limits, overview))
    else:
        render.stdout.print("no rate limits")
    if overview.keys_waiting:
        render.stdout.print(_keys_table(overview.keys_waiting))
    return Exit.OK
