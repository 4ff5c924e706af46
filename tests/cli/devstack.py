"""One `awp dev` stack as a subprocess (real PostgreSQL, server, coordinator, two workers)
on free ports in a fresh directory, for a test module's fixture; stopped at the end with
SIGINT, which must end it cleanly."""

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

STARTUP_S = 60
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

    def awp(self, *args: str, timeout: float = 60) -> Result:
        return awp("--address", self.address, *args, timeout=timeout)

    def output(self) -> str:
        return "\n".join(self.lines)

    def worker_logs(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.data_dir.glob("logs/worker-*")))


def _read_lines(stack: DevStack, ready: threading.Event) -> None:
    assert stack.process.stdout is not None
    for line in stack.process.stdout:
        stack.lines.append(line.rstrip("\n"))
        if found := re.search(r"awp-server listening on (\S+)", line):
            stack.address = found[1]
        if found := re.search(r"(http://127\.0\.0\.1:\d+/metrics) \(server\)", line):
            stack.metrics_url = found[1]
        if found := re.search(r"console +(http://127\.0\.0\.1:\d+)", line):
            stack.console_url = found[1]
        if "awp dev: ready" in line:
            ready.set()
    ready.set()  # output ended: the process is gone


def dev_stack(modules: Sequence[str]) -> Iterator[DevStack]:
    """A running stack whose workers import `modules` (the tests directory is importable)."""
    # Not under pytest's basetemp: as root, PostgreSQL runs as another user that must
    # traverse the path, and every pytest session resets that tree to mode 0700.
    data_dir = Path(tempfile.mkdtemp(prefix="awp-cli-test-"))
    try:
        yield from _run_stack(data_dir, modules)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _run_stack(data_dir: Path, modules: Sequence[str]) -> Iterator[DevStack]:
    path = os.pathsep.join(p for p in (str(TESTS), ENV.get("PYTHONPATH", "")) if p)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "awp_cli", "dev",
            "--data-dir", str(data_dir),
            "--listen", "127.0.0.1:0",
            "--metrics-port", "0",
            "--console-port", "0",
            "--workers", "2",
            *(arg for module in modules for arg in ("--module", module)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**ENV, "PYTHONPATH": path},
        cwd=REPOSITORY,
    )  # fmt: skip
    dev = DevStack(process, data_dir)
    ready = threading.Event()
    reader = threading.Thread(target=_read_lines, args=(dev, ready), daemon=True)
    reader.start()
    try:
        assert ready.wait(STARTUP_S), f"awp dev not ready in {STARTUP_S} s:\n{dev.output()}"
        assert process.poll() is None, f"awp dev exited:\n{dev.output()}"
        assert dev.address and dev.metrics_url and dev.console_url, dev.output()
        yield dev
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        reader.join(5)
    assert code == 0, f"awp dev did not stop cleanly (exit {code}):\n{dev.output()}"
    assert "awp dev: stopped" in dev.output()
    assert not (data_dir / "pg" / "postmaster.pid").exists(), "PostgreSQL still running"
    assert (data_dir / "logs" / "worker-1.log").read_text().strip()
