"""What resumes a waiting task (docs/design.md §16): `awp signal send`, `awp approve` and
`awp reject`, through the SDK's AsyncClient; --json prints the answer through
awp_sdk.wire, as every other command does."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.markup import escape

from awp_cli import render
from awp_cli.commands import json_value
from awp_cli.errors import Exit
from awp_sdk import wire
from awp_sdk.client import AsyncClient
from awp_sdk.records import Decided

Add = Callable[..., argparse.ArgumentParser]


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], add: Add) -> None:
    group = commands.add_parser("signal", help="send a run a signal its tasks wait for")
    signals = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    send = add(
        signals,
        "send",
        signal_send,
        "send a run a signal: the oldest task waiting for its name takes it, else it is "
        "kept until a task waits for it",
    )
    send.add_argument("run_id", metavar="RUN_ID")
    send.add_argument("name", metavar="NAME", help="the signal's name, as the task waits for it")
    send.add_argument(
        "--payload",
        type=json_value,
        default=None,
        metavar="JSON",
        help="what the waiting task receives: any JSON value, or @FILE (default: null)",
    )
    send.add_argument(
        "--request-id", help="idempotency key: sending again with it sends nothing more"
    )
    for name, handler, verb in (("approve", approve, "approve"), ("reject", reject, "reject")):
        decide = add(
            commands,
            name,
            handler,
            f"{verb} what a waiting task asks (the approver or admin role)",
        )
        decide.add_argument("run_id", metavar="RUN_ID")
        decide.add_argument("task_key", metavar="TASK")
        decide.add_argument("--comment", default="", help="recorded with the decision")


async def signal_send(client: AsyncClient, args: argparse.Namespace) -> Exit:
    sent = await client.send_signal(
        args.run_id, args.name, args.payload, request_id=args.request_id
    )
    if args.json:
        render.print_json(wire.signal_sent(sent))
        return Exit.OK
    told = f"signal [bold]{escape(args.name)}[/] ({sent.signal_id}) "
    if sent.duplicate:
        told += "was sent already with this request id"
    elif sent.delivered_to:
        told += f"resumed task [bold]{escape(sent.delivered_to)}[/]"
    else:
        told += f"is kept until a task of run {args.run_id} waits for it"
    render.stdout.print(told)
    return Exit.OK


async def approve(client: AsyncClient, args: argparse.Namespace) -> Exit:
    decided = await client.approve(args.run_id, args.task_key, args.comment)
    return _told(args, "approved", decided)


async def reject(client: AsyncClient, args: argparse.Namespace) -> Exit:
    decided = await client.reject(args.run_id, args.task_key, args.comment)
    return _told(args, "rejected", decided)


def _told(args: argparse.Namespace, verb: str, decided: Decided) -> Exit:
    if args.json:
        render.print_json(wire.decided(decided))
        return Exit.OK
    resumed = f", resuming attempt {decided.resumed_attempt}" if decided.resumed_attempt else ""
    render.stdout.print(
        f"{verb} task [bold]{escape(args.task_key)}[/] of run {args.run_id}{resumed}: it is "
        f"{decided.task_state} (awp run get {args.run_id})"
    )
    return Exit.OK
