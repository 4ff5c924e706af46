"""The CLI and the worker on the SDK's footing, as processes against a real server:
`awp workflow apply MODULE:ATTRIBUTE`, `awp-worker --module` running a workflow's task
functions, `run watch --json` numbers, the default port, the unreachable message."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from awp_cli.main import build_parser
from awp_common import flags
from awp_common.processes import free_port
from awp_coordinator.coordinator import Coordinator
from awp_sdk import AsyncClient
from awp_sdk.connection import Connection
from cli.runner import ENV, awp_async
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerHandle

MODULE = """\
import os

from awp_sdk import ActionContext, Workflow

wf = Workflow("sdk-module", version=1)


@wf.task(timeout="30s")
def where(ctx: ActionContext, input: dict) -> dict:
    return {"pid": os.getpid(), "attempt": ctx.attempt}


@wf.task(depends_on=[where])
def after(ctx: ActionContext, input: dict) -> dict:
    return {"seen": ctx.upstream["where"]["pid"]}


broken = Workflow("sdk-module-broken", version=1)
broken.add("a", kind="mock", action="x")
broken.add("a", kind="mock", action="x")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "my_flows.py").write_text(MODULE)
    return tmp_path


@pytest.fixture
async def worker(
    project: Path, awp_server: ServerHandle, coordinator: Coordinator
) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "awp_worker.main",
        "--server", awp_server.address,
        "--worker-token", WORKER_TOKEN,
        "--kinds", "python",
        "--module", "my_flows",
        "--claim-wait", "0.5",
        cwd=project,
        env=ENV,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()


async def test_a_workflow_in_code_is_applied_by_reference_and_run_by_awp_worker(
    project: Path, awp_server: ServerHandle, worker: asyncio.subprocess.Process
) -> None:
    address = ("--address", awp_server.address, "--token", ADMIN_TOKEN)
    applied = await awp_async("workflow", "apply", "my_flows:wf", *address, cwd=project)
    assert (applied.code, applied.out.strip()) == (0, "created workflow sdk-module@1 (2 tasks)")
    again = await awp_async("workflow", "apply", "my_flows:wf", *address, cwd=project)
    assert "is unchanged" in again.out

    async with AsyncClient(awp_server.address, token=ADMIN_TOKEN) as client:
        outputs = await (await client.start("sdk-module")).result(timeout=60)
    assert outputs == {
        "where": {"pid": worker.pid, "attempt": 1},
        "after": {"seen": worker.pid},
    }

    missing = await awp_async("workflow", "apply", "my_flows:nothing", *address, cwd=project)
    assert (missing.code, missing.err.strip()) == (
        2,
        "awp: my_flows:nothing: my_flows has no attribute 'nothing'",
    )
    invalid = await awp_async("workflow", "apply", "my_flows:broken", *address, cwd=project)
    assert invalid.code == 2
    assert invalid.err.splitlines() == [
        "awp: my_flows:broken: INVALID_DEFINITION: 1 invalid field",
        "  definition.tasks[1].key: duplicate key 'a' (also tasks[0])",
    ]


async def test_watch_json_prints_integers_as_integers(
    project: Path, awp_server: ServerHandle, worker: asyncio.subprocess.Process
) -> None:
    async with AsyncClient(awp_server.address, token=ADMIN_TOKEN) as client:
        await client.apply(_module_workflow(project))
        run = await client.start("sdk-module", input={"n": 3})
        await run.result(timeout=60)
    watched = await awp_async(
        "run", "watch", run.id, "--json", "--address", awp_server.address, "--token", ADMIN_TOKEN
    )
    assert watched.code == 0
    first = watched.out.splitlines()[0]
    # A Struct's keys come in any order: the number is followed by a comma or a brace.
    assert re.search(r'"version": 1[,}]', first), first
    events = watched.json_lines()
    assert events[0]["type"] == "EVENT_TYPE_RUN_CREATED"
    assert type(events[0]["payload"]["version"]) is int
    got = await awp_async(
        "run", "get", run.id, "--json", "--address", awp_server.address, "--token", ADMIN_TOKEN
    )
    # json reads 3.0 as a float: the type says which the CLI printed.
    assert type(json.loads(got.out)["run"]["input"]["n"]) is int


def _module_workflow(project: Path) -> object:
    sys.path.insert(0, str(project))
    try:
        import my_flows  # type: ignore[import-not-found]  # noqa: PLC0415
    finally:
        sys.path.remove(str(project))
    return my_flows.wf


def test_an_address_without_a_port_means_50051() -> None:
    parser = build_parser()
    for given, meant in [
        ("localhost", "localhost:50051"),
        ("awp.internal:7000", "awp.internal:7000"),
        ("[::1]", "[::1]:50051"),
        ("::1", "[::1]:50051"),
        ("dns:///awp.internal:443", "dns:///awp.internal:443"),
    ]:
        args = parser.parse_args(["--address", given, "stats"])
        assert flags.settings(Connection, parser, args, {}).address == meant
        assert Connection(address=given).address == meant
        assert Connection.from_env({"AWP_ADDRESS": given}).address == meant
    with pytest.raises(ValueError, match="expected HOST"):
        Connection(address="host:port")


async def test_the_unreachable_message_names_the_address_and_how_to_start_one() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = await awp_async("--address", address, "--timeout", "5s", "stats")
    assert result.code == 3
    (line,) = result.err.splitlines()
    assert line.startswith(f"awp: cannot reach awp-server at {address}: ")
    assert line.endswith("start one on this machine with `awp dev`, or point AWP_ADDRESS "
                         "(the CLI's --address) at a running one")  # fmt: skip
