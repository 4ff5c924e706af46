"""`awp`: the command line. Parses arguments, runs one command, maps failures to exit codes.

Connection options (--address, --token, --timeout, --json) may be given before or
after the command: `awp --json run list` and `awp run list --json` mean the same. The
first three are settings (awp_sdk.Connection): each also an AWP_* environment variable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

from rich.text import Text

from awp_cli import (
    batch_commands,
    commands,
    credentials,
    limits,
    render,
    run_commands,
    schedules,
    wait_commands,
)
from awp_cli.dev import command as dev
from awp_cli.errors import CliError, Exit, exit_error
from awp_cli.stream_command import run_stream
from awp_common import flags
from awp_console.main import add_command as add_console
from awp_protocol.states import RUN_STATES
from awp_sdk.client import AsyncClient
from awp_sdk.connection import Connection
from awp_sdk.errors import AwpError

Handler = Callable[[AsyncClient, argparse.Namespace], Awaitable[Exit]]

EPILOG = """\
exit codes: 0 ok, 1 the run failed or was canceled, 2 bad usage or input (including
what the server refused as invalid or not found), 3 the server failed or cannot be reached.
"""


def _connection_options(*, suppress: bool) -> argparse.ArgumentParser:
    """The settings (--address, --token, --timeout) and --json; on subcommands not given
    they are suppressed, so that a value given before the command is not overwritten."""
    options = argparse.ArgumentParser(add_help=False)
    flags.add_flags(options, Connection, suppress=suppress)
    options.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print the protobuf JSON of the answer (as grpcurl does) instead of tables",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="awp",
        description="AWP: define workflows, run and watch them, inspect workers.",
        epilog=EPILOG,
        parents=[_connection_options(suppress=False)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options = _connection_options(suppress=True)
    commands_ = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        group: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        handler: Handler,
        help_text: str,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(name, help=help_text, description=help_text, parents=[options])
        sub.set_defaults(handler=handler)
        return sub

    workflow = commands_.add_parser("workflow", help="create and inspect workflows")
    workflows = workflow.add_subparsers(dest="action", required=True, metavar="ACTION")
    apply = add(
        workflows,
        "apply",
        commands.workflow_apply,
        "store a workflow from a YAML/JSON file or an awp_sdk.Workflow in code",
    )
    apply.add_argument(
        "file",
        metavar="FILE|MODULE:ATTRIBUTE",
        help="a workflow file (.yaml, .yml, .json) or a Workflow in code (my_app.flows:digest)",
    )
    listing = add(workflows, "list", commands.workflow_list, "list workflows")
    listing.add_argument("--name", help="only this workflow's versions")
    listing.add_argument("--limit", type=_positive, default=100, help="at most this many")
    get = add(workflows, "get", commands.workflow_get, "show one workflow (latest version)")
    get.add_argument("workflow", type=commands.workflow_ref, help="NAME or NAME@VERSION")

    run = commands_.add_parser(
        "run", aliases=["runs"], help="start, watch, cancel, retry and prune runs"
    )
    runs = run.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = add(runs, "start", run_commands.run_start, "start a run of a workflow")
    start.add_argument("workflow", type=commands.workflow_ref, help="NAME or NAME@VERSION")
    start.add_argument(
        "--input", type=commands.json_object, help="run input: a JSON object, or @FILE"
    )
    start.add_argument(
        "--request-id", help="idempotency key: starting again with it returns the same run"
    )
    start.add_argument(
        "--in",
        dest="start_in",
        type=flags.positive_duration,
        metavar="DURATION",
        help="a delayed start: the run exists now, its first tasks become ready this much later",
    )
    start.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="-10 to 10, added to each task's own; higher goes first, with aging (default 0)",
    )
    start.add_argument(
        "--wait",
        action="store_true",
        help="follow the run to its end; exit 0 if it succeeded, 1 if it failed or was canceled",
    )
    many = add(
        runs,
        "start-many",
        batch_commands.run_start_many,
        "start many runs of a workflow, one per input line, 1,000 per call and transaction",
    )
    many.add_argument("workflow", type=commands.workflow_ref, help="NAME or NAME@VERSION")
    many.add_argument(
        "inputs", metavar="FILE", help="one JSON object per line, each a run's input; - for stdin"
    )
    many.add_argument(
        "--request-id-prefix",
        metavar="PREFIX",
        help="run i gets the request id PREFIX-i: starting the file again starts nothing twice",
    )
    many.add_argument(
        "--priority", type=int, default=0, metavar="N", help="-10 to 10, as for run start"
    )
    get_run = add(runs, "get", run_commands.run_get, "show a run with its tasks and attempts")
    get_run.add_argument("run_id", metavar="RUN_ID")
    tasks = add(
        runs, "tasks", run_commands.run_tasks, "list every task of a run, map elements included"
    )
    tasks.add_argument("run_id", metavar="RUN_ID")
    output = add(runs, "output", run_commands.run_output, "print one task's output as JSON")
    output.add_argument("run_id", metavar="RUN_ID")
    output.add_argument("task_key", metavar="TASK")
    list_runs = add(runs, "list", run_commands.run_list, "list runs, newest first")
    list_runs.add_argument("--workflow", help="only runs of this workflow")
    list_runs.add_argument("--state", choices=RUN_STATES, help="only runs in this state")
    list_runs.add_argument("--limit", type=_positive, default=50, help="at most this many")
    watch = add(runs, "watch", run_commands.run_watch, "print a run's events until it ends")
    watch.add_argument("run_id", metavar="RUN_ID")
    watch.add_argument(
        "--after-seq", type=int, default=0, help="only events after this seq (to resume)"
    )
    stream = add(
        runs, "stream", run_stream, "print a task's output stream as it is written, to its end"
    )
    stream.add_argument("run_id", metavar="RUN_ID")
    stream.add_argument("task_key", metavar="TASK")
    stream.add_argument(
        "--from",
        dest="from_offset",
        type=_non_negative,
        default=0,
        metavar="N",
        help="start at this position (the last position received + 1, to resume)",
    )
    retry = add(
        runs,
        "retry",
        run_commands.run_retry,
        "start a new run of a finished run's workflow and input that reuses what succeeded",
    )
    retry.add_argument("run_id", metavar="RUN_ID")
    retry.add_argument(
        "--from",
        dest="from_task",
        metavar="TASK",
        help="re-run this task and everything downstream of it, even what succeeded",
    )
    retry.add_argument(
        "--request-id", help="idempotency key: retrying again with it returns the same run"
    )
    retry.add_argument(
        "--wait",
        action="store_true",
        help="follow the new run to its end; exit 0 if it succeeded, 1 if not",
    )
    cancel = add(runs, "cancel", run_commands.run_cancel, "cancel a run")
    cancel.add_argument("run_id", metavar="RUN_ID")
    cancel.add_argument("--reason", help="recorded with the cancel request")
    cancel.add_argument("--wait", action="store_true", help="wait until the run has ended")
    prune = add(
        runs,
        "prune",
        run_commands.run_prune,
        "delete finished runs older than an age, with everything they hold (admin role)",
    )
    prune.add_argument(
        "--older-than",
        type=flags.positive_duration,
        required=True,
        metavar="DURATION",
        help="runs that finished longer ago than this, e.g. 7d or 12h",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )

    logs = add(
        commands_,
        "logs",
        run_commands.logs,
        "every attempt of a run (or of one task): worker, times, outcome, error, traceback "
        "and log tail",
    )
    logs.add_argument("run_id", metavar="RUN_ID")
    logs.add_argument("task", metavar="TASK", nargs="?", help="only this task's attempts")
    workers = add(commands_, "workers", commands.workers, "list worker sessions")
    workers.add_argument("--all", action="store_true", help="include stopped and offline ones")
    add(commands_, "stats", commands.stats, "queue depth, leases and workers by state")

    schedules.add_commands(commands_, add)
    wait_commands.add_commands(commands_, add)
    limits.add_commands(commands_, add)
    dev.add_commands(commands_)
    add_console(commands_)
    credentials.add_commands(commands_)
    return parser


def _positive(text: str) -> int:
    return _at_least(text, 1)


def _non_negative(text: str) -> int:
    return _at_least(text, 0)


def _at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


async def _with_client(target: Connection, handler: Handler, args: argparse.Namespace) -> Exit:
    async with AsyncClient(connection=target) as client:
        return await handler(client, args)


def run(argv: Sequence[str] | None = None) -> Exit:
    """Runs one command; returns its exit code (tests call this in-process)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if hasattr(args, "handler"):
            target = flags.settings(Connection, parser, args)
            return asyncio.run(_with_client(target, args.handler, args))
        code: Exit = args.run(args)
        return code
    except CliError as error:
        report(error)
        return error.code
    except AwpError as error:
        failure = exit_error(error)
        report(failure)
        return failure.code
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


def report(error: CliError) -> None:
    first, *rest = error.lines()
    render.stderr.print(Text(f"awp: {first}", style="red"))
    for line in rest:
        render.stderr.print(Text(line))


def main(argv: Sequence[str] | None = None) -> NoReturn:
    try:
        code = run(argv)
    except BrokenPipeError:
        # `awp run list | head`: the reader left; nothing more to say, and no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = Exit.OK
    sys.exit(int(code))
