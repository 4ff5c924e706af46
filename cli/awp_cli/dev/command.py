"""`awp dev` (the whole stack on this machine until Ctrl-C) and `awp demo` (the same stack
in a throwaway directory, one example run, then everything stopped)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

from google.protobuf import struct_pb2
from rich.text import Text

from awp.v1 import control_pb2
from awp_cli import render, workflow_file
from awp_cli.client import Client
from awp_cli.commands import wait_for_run
from awp_cli.errors import Exit, usage
from awp_cli.follow import run_exit
from awp_common import extras
from awp_sdk.connection import DEFAULT_ADDRESS, Connection

if TYPE_CHECKING:
    from awp_cli.dev.stack import Stack

# The demo ships inside the wheel (package awp_demo), so `awp demo` works wherever `awp`
# is installed. It is a workflow in code, named rather than imported (it sits above the
# CLI): `awp demo` applies it as `awp workflow apply awp_demo.workflow:wf` would, and the
# workers import the module for its actions. workflow.yaml beside it is its twin as a file.
DEMO_PACKAGE: Final = "awp_demo"
DEMO_MODULE: Final = f"{DEMO_PACKAGE}.workflow"
DEMO_WORKFLOW: Final = f"{DEMO_MODULE}:wf"
DEMO_WORKFLOW_FILE: Final = "workflow.yaml"


def demo_workflow() -> Path:
    """Where the installed demo workflow file is (a plain file: the package is not zipped)."""
    return Path(str(resources.files(DEMO_PACKAGE) / DEMO_WORKFLOW_FILE))


DEMO_INPUT: Final = {"requested_by": "make demo"}


def default_data_dir() -> Path:
    if xdg := os.environ.get("XDG_DATA_HOME"):
        return Path(xdg) / "awp" / "dev"
    if os.geteuid() == 0:
        # As root, PostgreSQL runs as a system user of its own, which must traverse every
        # parent of the data dir: under /root (0700) that would mean opening /root to all.
        return Path("/var/lib/awp/dev")
    return Path.home() / ".local" / "share" / "awp" / "dev"


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = commands.add_parser(
        "dev",
        help="run PostgreSQL, awp-server, awp-coordinator and workers here until Ctrl-C",
        description=(
            "Starts a private PostgreSQL (its data kept in --data-dir across runs), "
            "awp-server, awp-coordinator and --workers awp-workers, on loopback without "
            "tokens. Ctrl-C (or SIGTERM) stops them: workers first, so they drain. Killed, "
            "it takes them along; what a killed one left is stopped at the next start. "
            "`make cluster` runs it with 2 servers and 2 coordinators (deploy/README.md)."
        ),
    )
    dev.add_argument("--workers", type=_count, default=2, help="worker processes (default 2)")
    dev.add_argument(
        "--servers",
        type=_at_least_one,
        default=1,
        help="awp-server processes, on --listen's port and the next ones; workers are "
        "spread over them (default 1)",
    )
    dev.add_argument(
        "--coordinators",
        type=_at_least_one,
        default=1,
        help="awp-coordinator processes: one leads, the others stand by (default 1)",
    )
    dev.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help=f"PostgreSQL data and logs (default {default_data_dir()})",
    )
    dev.add_argument(
        "--listen", default=DEFAULT_ADDRESS, help=f"gRPC HOST:PORT (default {DEFAULT_ADDRESS})"
    )
    dev.add_argument("--concurrency", type=_count, default=8, help="leases per worker (default 8)")
    dev.add_argument(
        "--module",
        action="append",
        default=[],
        help="module with @action functions for the python executor; repeatable",
    )
    dev.add_argument(
        "--reload",
        action="store_true",
        help="restart the workers when a Python file of a --module package changes",
    )
    _add_output_flags(dev)
    dev.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="Prometheus port of the (first) server; the next ports go to the other "
        "servers, the coordinators, then one per worker (default 9464; 0 picks free ports)",
    )
    dev.add_argument(
        "--console-port",
        type=int,
        default=8080,
        help="port of the web console on 127.0.0.1 (default 8080; 0 picks a free one)",
    )
    dev.add_argument("--no-console", action="store_true", help="do not start the web console")
    dev.set_defaults(run=run_dev)

    demo = commands.add_parser(
        "demo",
        help="start a throwaway stack, run the example workflow, stop (what `make demo` runs)",
        description=(
            f"Runs the example workflow in code ({DEMO_WORKFLOW}) on a fresh stack in a "
            "temporary directory: a plan, one search per planned query in parallel (a map), "
            "a summary whose first attempt fails and is retried, a publish and a cleanup; "
            "prints the progress and the outcome, then stops everything."
        ),
    )
    demo.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    _add_output_flags(demo)
    demo.set_defaults(run=run_demo)


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also print every process's log here, each line prefixed by its name",
    )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be 0 to 64, got {value}")
    return value


def _at_least_one(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _say(prefix: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        style = "yellow" if message.startswith("warning") else "dim"
        render.stdout.print(Text(f"{prefix}: {message}", style=style), soft_wrap=True)

    return say


# ---------------------------------------------------------------- awp dev


# awp_cli.dev.stack (and reload) are imported by the two commands that need them, once
# the 'local' extra is known to be installed: they pull in the embedded PostgreSQL,
# asyncpg and watchfiles, which the base install lacks and every other command would pay
# for at startup.


def _require_local(command: str) -> None:
    problem = extras.LOCAL.problem(command)
    if problem is not None:
        raise usage(problem)


def run_dev(args: argparse.Namespace) -> Exit:
    _require_local("awp dev")
    from awp_cli.dev.reload import Reloader, watched_paths  # noqa: PLC0415 (see above)
    from awp_cli.dev.stack import Stack, StackConfig, operate  # noqa: PLC0415 (see above)

    processes = args.servers + args.coordinators + args.workers
    if not 0 <= args.metrics_port <= 65535 - processes:
        raise usage(f"--metrics-port {args.metrics_port} leaves no room for every process")
    config = StackConfig(
        data_dir=args.data_dir,
        listen=args.listen,
        workers=args.workers,
        servers=args.servers,
        coordinators=args.coordinators,
        concurrency=args.concurrency or 1,
        modules=tuple(args.module),
        metrics_port=args.metrics_port,
        verbose=args.verbose,
        console_port=None if args.no_console else args.console_port,
    )
    if args.reload and not config.modules:
        raise usage("--reload watches the files of the --module packages: pass --module")
    reloader = Reloader(watched_paths(config.modules), _say("awp dev")) if args.reload else None
    stack = Stack(config, _say("awp dev"))

    def serve(started: Stack) -> Exit:
        if reloader is None:
            _print_ready(started)
            started.supervise()
            return Exit.OK
        started.say("restarting workers on changes under " + ", ".join(map(str, reloader.paths)))
        reloader.start()
        _print_ready(started)
        try:
            started.supervise(reload=reloader.changed)
        finally:
            reloader.stop()
        return Exit.OK

    # Ctrl-C is how `awp dev` is meant to end: a clean stop is a success.
    code = operate(stack, serve, interrupted=Exit.OK)
    if code == Exit.OK:
        render.stdout.print(Text(f"awp dev: data kept in {stack.data_dir}", style="dim"))
    return code


def _print_ready(stack: Stack) -> None:
    m = stack.metrics
    logs = ",".join(c.name for c in stack.children())
    first, *others = [c for c in stack.children() if c.name in m]
    metrics = ", ".join(
        [f"http://127.0.0.1:{m[first.name]}/metrics ({first.name})"]
        + [f":{m[c.name]} ({c.name})" for c in others]
    )
    address_hint = "" if stack.address == DEFAULT_ADDRESS else f" --address {stack.address}"
    postgres = stack.postgres
    assert postgres is not None
    servers = ", ".join(stack.addresses)
    lines = [
        ("server", f"{servers}  (plaintext, no tokens: loopback only)"),
        *([("console", stack.console_url)] if stack.console_url else []),
        ("metrics", metrics),
        (
            "workers",
            f"{len(stack.workers)} x kinds mock,python, concurrency {stack.config.concurrency}",
        ),
        ("logs", f"{stack.logs}/{{{logs}}}.log, {postgres.log_file}"),
        ("database", f"{postgres.dsn}  (data in {postgres.data_dir}, kept across runs)"),
        ("try", f"awp{address_hint} workflow apply {DEMO_WORKFLOW}"),
        ("", f"awp{address_hint} run start research-digest --wait"),
    ]
    if DEMO_MODULE not in stack.config.modules:
        lines.append(("", f"(its python actions need: awp dev --module {DEMO_MODULE})"))
    for label, value in lines:
        render.stdout.print(Text(f"  {label:<9} ", style="dim") + Text(value), soft_wrap=True)
    # Last, so that a script waiting for this line has everything above it.
    render.stdout.print(
        Text("awp dev: ready", style="bold green")
        + Text(" (Ctrl-C stops everything; the data stays)", style="dim")
    )


# ---------------------------------------------------------------- awp demo


def run_demo(args: argparse.Namespace) -> Exit:
    _require_local("awp demo")
    from awp_cli.dev.stack import Stack, StackConfig, operate  # noqa: PLC0415 (see above)

    began = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="awp-demo-"))
    config = StackConfig(
        data_dir=data_dir,
        listen="127.0.0.1:0",
        workers=2,
        concurrency=8,
        modules=(DEMO_MODULE,),
        metrics_port=0,
        unsafe_fast=True,
        verbose=args.verbose,
    )
    stack = Stack(config, _say("awp demo"))

    def demo(started: Stack) -> Exit:
        return asyncio.run(_demo_run(started))

    try:
        code = operate(stack, demo, interrupted=Exit.INTERRUPTED)
    finally:
        if args.keep:
            render.stdout.print(Text(f"awp demo: data and logs kept in {data_dir}", style="dim"))
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    outcome = "succeeded" if code == Exit.OK else "did not succeed"
    render.stdout.print(
        Text(f"awp demo {outcome} in {time.monotonic() - began:.1f} s", style="bold")
    )
    return code


async def _demo_run(stack: Stack) -> Exit:
    say = stack.say
    definition = workflow_file.from_code(DEMO_WORKFLOW)
    async with Client(Connection(address=stack.address)) as client:
        created = await client.call(
            client.control.CreateWorkflow,
            control_pb2.CreateWorkflowRequest(definition=definition),
        )
        say(f"applied {DEMO_WORKFLOW}:")
        render.stdout.print(render.workflow_view(created.workflow))
        run_input = struct_pb2.Struct()
        run_input.update(DEMO_INPUT)
        started = await client.call(
            client.control.StartRun,
            control_pb2.StartRunRequest(
                workflow_name=definition.name,
                workflow_version=definition.version,
                input=run_input,
            ),
        )
        say(f"started run {started.run.id}")
        final = await wait_for_run(client, started.run)
        render.stdout.print(render.tasks_table(final))
        return run_exit(final.run)
