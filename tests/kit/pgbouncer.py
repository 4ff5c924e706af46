"""A real pgbouncer (Debian's package) in front of a test's PostgreSQL database, as
operators run it (docs/postgres.md): one pool in transaction mode for AWP's transactions,
one in session mode for the connections that need a session (LISTEN, migrations).

`.ci/run` installs the package; a machine without it fails the test with the command that
installs it, rather than skipping. pgbouncer refuses to run as root: under root it runs as
the PostgreSQL package's system user, like kit.system_postgres.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from awp_common.processes import free_port
from kit import poll_until

BINARY = Path("/usr/sbin/pgbouncer")
USER = "postgres"
# The aliases clients name in their URL; both lead to the same database.
POOLED = "awp"
SESSION = "awp_session"


@dataclass
class PgBouncer:
    """pgbouncer for one database behind `dsn` (a postgresql:// URL without a password)."""

    dsn: str
    # Backends of the transaction pool: few, so that every client shares them with the
    # others, which is what exposes session state relied on across transactions.
    pool_size: int = 4
    # Backends of the session pool: one per client for its whole connection (each AWP
    # process's LISTEN, and its migration at start), so enough for every process.
    session_pool_size: int = 20
    port: int = 0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="awp-pgbouncer-")))
    _popen: subprocess.Popen[bytes] | None = None

    @property
    def pooled_dsn(self) -> str:
        """Transaction pooling: what AWP's --database-url points at."""
        return f"postgresql://awp@127.0.0.1:{self.port}/{POOLED}"

    @property
    def session_dsn(self) -> str:
        """Session pooling: what AWP's --session-database-url points at."""
        return f"postgresql://awp@127.0.0.1:{self.port}/{SESSION}"

    @property
    def log_path(self) -> Path:
        return self.root / "pgbouncer.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _config(self) -> str:
        target = urlsplit(self.dsn)
        backend = (
            f"host={target.hostname} port={target.port} dbname={target.path.lstrip('/')} "
            f"user={target.username}"
        )
        return "\n".join(
            [
                "[databases]",
                f"{POOLED} = {backend} pool_mode=transaction",
                f"{SESSION} = {backend} pool_mode=session pool_size={self.session_pool_size}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                # Clients are trusted on loopback; the backend login is the one above.
                "auth_type = any",
                f"default_pool_size = {self.pool_size}",
                "max_client_conn = 500",
                f"logfile = {self.log_path}",
                f"pidfile = {self.root / 'pgbouncer.pid'}",
                # Quick to notice a closed client or backend in a test.
                "server_check_delay = 1",
                "",
            ]
        )

    def start(self) -> PgBouncer:
        if not BINARY.exists():
            pytest.fail("pgbouncer is not installed: apt-get install pgbouncer (.ci/run does)")
        if self.port == 0:
            self.port = free_port()
        config = self.root / "pgbouncer.ini"
        config.write_text(self._config())
        as_root = os.geteuid() == 0
        if as_root:
            entry = pwd.getpwnam(USER)
            for path in (self.root, config):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._popen = subprocess.Popen(
            [str(BINARY), str(config)],
            user=USER if as_root else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    async def wait_ready(self, within: float = 20.0) -> None:
        def accepting() -> bool:
            if self._popen is not None and self._popen.poll() is not None:
                raise AssertionError(f"pgbouncer exited early:\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return True
            return False

        await poll_until(accepting, "pgbouncer to accept connections", within=within, interval=0.02)

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.terminate()  # SIGTERM: immediate shutdown (SIGINT waits for clients)
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running(dsn: str, **options: int) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(dsn, **options).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
