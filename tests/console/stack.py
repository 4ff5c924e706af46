"""Real processes for the console's browser tests: awp-server with named credentials,
awp-coordinator, an awp-worker running the actions of console_actions, and `awp
console` in front of them, each an OS process with its own log (fault.process).

Timings are the fault suite's compressed ones (a 2 s lease, a 0.25 s heartbeat), so a
run moves as soon as a test lets it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import duration_pb2

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_common.processes import clean_env, command, free_ports
from awp_protocol.jsonvalue import dict_to_struct
from awp_protocol.roles import Role, file_entry
from fault.process import Process
from kit import poll_until

TESTS = Path(__file__).resolve().parents[1]
# Who may sign in to the console, and as what.
USERS = {
    "root": Role.ADMIN,
    "alice": Role.SUBMITTER,
    "victor": Role.VIEWER,
    "ada": Role.APPROVER,
    "fleet": Role.WORKER,
}
TOKENS = {name: f"console-test-token-of-{name}" for name in USERS}
STARTUP_S = 30.0
# Every browser wait's deadline (Playwright's expect and actions poll until it): two cores
# shared with the rest of the suite, where a task panel's fetch has taken over 5 s. A
# longer deadline never slows a test that passes.
WAIT_MS = 30_000
# The console's link to a (pretend) tracing UI.
TRACE_URL = "http://tracing.example/trace/{trace_id}"


def auth(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name]}"),)


@dataclass
class ConsoleStack:
    dir: Path
    dsn: str
    processes: list[Process] = field(default_factory=list)
    worker: Process | None = None
    address: str = ""
    url: str = ""

    def control(self, channel: grpc.aio.Channel) -> control_pb2_grpc.ControlServiceAsyncStub:
        return control_pb2_grpc.ControlServiceStub(channel)

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address)

    async def call(self, method: str, request: Any, user: str = "root") -> Any:
        async with self.channel() as channel:
            return await getattr(self.control(channel), method)(
                request, metadata=auth(user), timeout=10
            )

    async def get_run(self, run_id: str) -> runs_pb2.GetRunResponse:
        return await self.call("GetRun", runs_pb2.GetRunRequest(run_id=run_id))

    async def wait_run(self, run_id: str, state: int) -> runs_pb2.GetRunResponse:
        async def reached() -> runs_pb2.GetRunResponse | None:
            answer = await self.get_run(run_id)
            return answer if answer.run.state == state else None

        return await poll_until(reached, f"run {run_id} to reach {state}", within=60)

    async def start_run(self, workflow: str, run_input: dict[str, Any]) -> str:
        request = runs_pb2.StartRunRequest(workflow_name=workflow, input=dict_to_struct(run_input))
        answer = await self.call("StartRun", request)
        return str(answer.run.id)

    async def apply(
        self, name: str, tasks: Sequence[tuple[str, str, Sequence[str]]], attempts: int = 1
    ) -> None:
        """A workflow of python actions: (key, action, depends_on) each, tried `attempts`
        times with no backoff."""
        definition = types_pb2.WorkflowDefinition(
            name=name,
            version=1,
            tasks=[
                types_pb2.TaskDefinition(
                    key=key,
                    executor_kind="python",
                    action=action,
                    depends_on=list(after),
                    retry=types_pb2.RetryPolicy(
                        max_attempts=attempts, initial_backoff=duration_pb2.Duration()
                    ),
                )
                for key, action, after in tasks
            ],
        )
        await self.call("CreateWorkflow", control_pb2.CreateWorkflowRequest(definition=definition))

    async def workers_registered(self) -> None:
        async def registered() -> bool:
            answer = await self.call("ListWorkers", control_pb2.ListWorkersRequest())
            return any(w.state == types_pb2.WORKER_STATE_ACTIVE for w in answer.workers)

        await poll_until(registered, "the worker to register", within=STARTUP_S)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail(40)}" for p in self.processes)

    async def stop(self) -> None:
        # The console first, the server last: what `awp dev` does.
        for process in reversed(self.processes):
            await process.stop(15)


def _spawn(stack: ConsoleStack, name: str, argv: list[str], env: dict[str, str]) -> Process:
    process = Process(name, argv, stack.dir / f"{name}.log", env)
    process.spawn()
    stack.processes.append(process)
    return process


async def _printed(process: Process, pattern: str) -> str:
    def found() -> str | None:
        if not process.alive:
            raise AssertionError(f"{process.name} exited:\n{process.tail()}")
        match = re.search(pattern, process.output())
        return match[1] if match else None

    return await poll_until(found, f"{process.name} to print {pattern!r}", within=STARTUP_S)


async def start(directory: Path, dsn: str) -> ConsoleStack:
    """Every process started in `directory` (which exists), the console last."""
    stack = ConsoleStack(directory, dsn)
    credentials = directory / "credentials.yaml"
    entries = [file_entry(name, TOKENS[name], [role]) for name, role in USERS.items()]
    credentials.write_text(yaml.safe_dump({"credentials": entries}))
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(TESTS), env.get("PYTHONPATH"))))
    # Chosen together: two free_port() calls in a row may return the same port.
    server_metrics, coordinator_metrics, listen = free_ports(3)
    try:
        server = _spawn(stack, "server", [
            *command("awp-server"), "--database-url", dsn,
            "--listen", f"127.0.0.1:{listen}", "--credentials-file", str(credentials),
            "--metrics-listen", f"127.0.0.1:{server_metrics}",
            "--lease-ttl", "2", "--heartbeat-interval", "0.25", "--stream-grace", "0.75",
            "--log-format", "text",
        ], env)  # fmt: skip
        stack.address = await _printed(server, r"awp-server listening on (\S+)")
        _spawn(stack, "coordinator", [
            *command("awp-coordinator"), "--database-url", dsn,
            "--scan-interval", "0.25", "--offline-after", "4",
            "--metrics-listen", f"127.0.0.1:{coordinator_metrics}", "--log-format", "text",
        ], env)  # fmt: skip
        stack.worker = _spawn(stack, "worker", [
            *command("awp-worker"), "--server", stack.address,
            "--worker-token", TOKENS["fleet"], "--name", "console-test-worker",
            "--kinds", "python,mock", "--module", "console.console_actions", "--concurrency", "8",
            "--claim-wait", "2", "--safety-margin", "0.5", "--shutdown-grace", "5",
            "--metrics-listen", "off", "--log-format", "text",
        ], env)  # fmt: skip
        console = _spawn(stack, "console", [
            *command("awp"), "console", "--address", stack.address,
            "--listen", "127.0.0.1:0", "--log-format", "text",
            "--metrics-url", f"http://127.0.0.1:{server_metrics}/metrics",
            "--metrics-url", f"http://127.0.0.1:{coordinator_metrics}/metrics",
            "--trace-url", TRACE_URL,
        ], env)  # fmt: skip
        stack.url = await _printed(console, r"awp console listening on (\S+)")
        await stack.workers_registered()
    except BaseException:
        await stack.stop()
        raise
    return stack
