"""Debian's PostgreSQL 15 for the benchmark: the server build the peers' scripts use
(bench/peers/), so AWP and Graphile Worker are measured on one build, back to back, in
one run. Stock durable settings (fsync, synchronous_commit and full_page_writes on,
shared_buffers 128MB) except what the peers' scripts change too: loopback only and
max_connections=200. Everyone connects over TCP to 127.0.0.1."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from awp_common.processes import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
# The package's system user: PostgreSQL refuses to run as root.
USER = "postgres"
HOST = "127.0.0.1"


@dataclass
class DebianPostgres:
    root: Path  # a private directory: data and log
    extra_settings: tuple[str, ...] = ()
    port: int = 0

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{database}"

    def version(self) -> str:
        out = subprocess.run(
            [str(BIN / "postgres"), "--version"], capture_output=True, text=True, check=True
        )
        return out.stdout.split()[2]  # "postgres (PostgreSQL) 15.20 (Debian ...)"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            user=USER if os.geteuid() == 0 else None,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> DebianPostgres:
        if not (BIN / "initdb").exists():
            raise SystemExit(
                "PostgreSQL 15 is not installed: apt-get install postgresql-15 "
                "(or run with --postgres embedded)"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust")
        self.port = free_port(HOST)
        settings = [
            f"listen_addresses={HOST}",
            f"port={self.port}",
            f"unix_socket_directories={self.root}",
            "max_connections=200",
            *self.extra_settings,
        ]
        options = " ".join(f"-c {s}" for s in settings)
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-w", "-l", str(self.log_file), "-o", options,
            "start",
        )  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", mode, "stop")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
