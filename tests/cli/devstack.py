"""`awp dev` as a subprocess, as a user starts it: its output read as it comes, its
address, metrics and console URLs picked from it, and a clean stop with SIGINT."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cli.runner import ENV, REPOSITORY, Result, awp

STARTUP_S = 90
STOP_S = 60
TESTS = REPOSITORY / "tests"


@dataclass
class DevStack:
    process: subprocess.Popen[str]
    data_dir: Path
    address: str = ""
    metrics_url: str = ""
    console_url: str = ""
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def awp(self, *args: str, timeout: float = 60) -> Result:
        return awp("--address", self.address, *args, timeout=timeout)

    def output(self) -> str:
        return "\n".join(self.lines)

    def worker_logs(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.data_dir.glob("logs/worker-*")))

    def wait_ready(self) -> None:
        assert self.ready.wait(STARTUP_S), f"awp dev not ready in {STARTUP_S} s:\n{self.output()}"
        assert self.process.poll() is None, f"awp dev exited:\n{self.output()}"
        assert self.address and self.metrics_url, self.output()

    def stop(self) -> int:
        """SIGINT (Ctrl-C), then its exit code once it has stopped everything."""
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if found := re.search(r"awp-server listening on (\S+)", line):
                self.address = self.address or found[1]
            if found := re.search(r"(http://127\.0\.0\.1:\d+/metrics) \(server", line):
                self.metrics_url = found[1]
            if found := re.search(r"console +(http://127\.0\.0\.1:\d+)", line):
                self.console_url = found[1]
            if "awp dev: ready" in line:
                self.ready.set()
        self.ready.set()  # output ended: the process is gone


def launch(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> DevStack:
    """Starts `awp dev --data-dir data_dir *args` on free ports; wait_ready() before use."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "awp_cli", "dev",
            "--data-dir", str(data_dir),
            "--listen", "127.0.0.1:0",
            "--metrics-port", "0",
            "--console-port", "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV | (env or {}),
        cwd=REPOSITORY,
    )  # fmt: skip
    dev = DevStack(process, data_dir)
    threading.Thread(target=dev._read, daemon=True).start()
    return dev


def dev_stack(modules: Sequence[str]) -> Iterator[DevStack]:
    """A running stack (server, coordinator, two workers, console) whose workers import
    `modules` (the tests directory is importable), for a test module's fixture; it must
    stop cleanly at the end."""
    # Not under pytest's basetemp: as root, PostgreSQL runs as another user that must
    # traverse the path, and every pytest session resets that tree to mode 0700.
    data_dir = Path(tempfile.mkdtemp(prefix="awp-cli-test-"))
    path = os.pathsep.join(p for p in (str(TESTS), ENV.get("PYTHONPATH", "")) if p)
    try:
        dev = launch(
            data_dir,
            "--workers", "2",
            *(arg for module in modules for arg in ("--module", module)),
            env={"PYTHONPATH": path},
        )  # fmt: skip
        try:
            dev.wait_ready()
            assert dev.console_url, dev.output()
            yield dev
        finally:
            code = dev.stop()
        assert code == 0, f"awp dev did not stop cleanly (exit {code}):\n{dev.output()}"
        assert "awp dev: stopped" in dev.output()
        assert not (data_dir / "pg" / "postmaster.pid").exists(), "PostgreSQL still running"
        assert (data_dir / "logs" / "worker-1.log").read_text().strip()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
