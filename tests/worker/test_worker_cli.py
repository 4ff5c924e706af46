"""The awp-worker process: flags, --module, JSON logs without secrets, /metrics, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from worker_fakes import TOKEN, FakeServer, FakeWorkerService, start_fake

from awp.v1 import worker_pb2
from awp_common import flags
from awp_common.processes import free_port
from awp_worker._config import WorkerConfig
from kit import poll_until
from kit.proto import output

ROOT = Path(__file__).resolve().parents[2]
ACTIONS = """
from awp_worker import ActionContext, action

@action("demo.greet")
def greet(ctx: ActionContext, input: dict) -> dict:
    ctx.logger.info("greeting %s", input["who"])
    return {"greeting": f"hello {input['who']}", "attempt": ctx.attempt}
"""


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = await start_fake(FakeWorkerService(heartbeat_interval=0.2))
    try:
        yield server
    finally:
        await server.stop()


async def spawn(tmp_path: Path, *argv: str, **variables: str) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env.pop("AWP_WORKER_TOKEN", None)
    env.update(variables)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "awp_worker.main",
        *argv,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_process_runs_actions_logs_json_serves_metrics_and_drains(
    fake: FakeServer, tmp_path: Path
) -> None:
    (tmp_path / "demo_actions.py").write_text(ACTIONS)
    service = fake.service
    metrics_port = free_port()
    process = await spawn(
        tmp_path,
        "--server", fake.address,
        "--worker-token", TOKEN,
        "--name", "cli-worker",
        "--kinds", "mock,python",
        "--module", "demo_actions",
        "--concurrency", "2",
        "--claim-wait", "0.5",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
        "--log-level", "DEBUG",
    )  # fmt: skip
    try:
        await poll_until(lambda: service.sessions, within=20)
        greet = await service.add("demo.greet", {"who": "ada"}, kind="python")
        mock = await service.add("m", {"n": 1})
        await poll_until(lambda: len(service.results()) == 2, within=20)
        assert output(service.results()[greet.dispatch_id]) == {
            "greeting": "hello ada",
            "attempt": 1,
        }
        assert service.results()[mock.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED

        def scrape() -> str:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                body: bytes = response.read()
                return body.decode()

        metrics = await asyncio.to_thread(scrape)
        assert 'awp_worker_executions_total{kind="python",outcome="succeeded"} 1.0' in metrics
        assert "awp_worker_leases_held" in metrics
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    assert service.sessions["w-1"] == "stopped"
    text = stderr.decode()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    # Every line about a lease names it; user code's lines too.
    greeting = next(line for line in lines if line["msg"] == "greeting ada")
    assert greeting["run_id"] == "run-1" and greeting["task_key"] == f"t{greet.dispatch_id}"
    assert greeting["attempt"] == 1 and greeting["worker_id"] == "w-1"
    lease_lines = [line for line in lines if "dispatch_id" in line]
    assert lease_lines and all(
        {"run_id", "task_key", "attempt", "worker_id"} <= set(line) for line in lease_lines
    )
    # No secret in any log line: worker token, session token, lease tokens.
    secrets = [TOKEN, *service.session_tokens.values(), greet.token, mock.token]
    assert not [s for s in secrets if s in text]


async def test_an_unimportable_module_is_a_usage_error(tmp_path: Path) -> None:
    process = await spawn(tmp_path, "--module", "no_such_module_here", "--server", "127.0.0.1:9")
    async with asyncio.timeout(20):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    assert b"no_such_module_here" in stderr


async def test_a_bad_token_exits_3_with_one_clear_line(fake: FakeServer, tmp_path: Path) -> None:
    process = await spawn(
        tmp_path, "--server", fake.address, "--worker-token", "nope", "--kinds", "mock"
    )
    async with asyncio.timeout(20):
        _, stderr = await process.communicate()
    assert process.returncode == 3
    errors = [json.loads(line) for line in stderr.decode().splitlines() if '"error"' in line]
    assert len(errors) == 1 and "TOKEN_INVALID" in errors[0]["msg"]
    assert "nope" not in stderr.decode()


async def test_help_names_every_flag_with_its_variable(tmp_path: Path) -> None:
    process = await spawn(tmp_path, "--help")
    async with asyncio.timeout(20):
        stdout, _ = await process.communicate()
    assert process.returncode == 0
    text = " ".join(stdout.decode().split())
    for _, spec in flags.flags_of(WorkerConfig):
        assert f"{spec.name} " in text and f"env {spec.env}" in text, spec


async def test_a_bad_duration_in_the_environment_is_a_usage_error_naming_it(
    tmp_path: Path,
) -> None:
    process = await spawn(tmp_path, "--server", "127.0.0.1:9", AWP_WORKER_CLAIM_WAIT="soon")
    async with asyncio.timeout(20):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    assert "AWP_WORKER_CLAIM_WAIT='soon' (for --claim-wait): expected a duration" in (
        stderr.decode()
    )
