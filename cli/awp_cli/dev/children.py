"""The child processes of `awp dev`: how each is started, logged, echoed and stopped."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final

from rich.text import Text

from awp_cli import render
from awp_cli.dev.lifetime import Record, die_with_parent
from awp_cli.errors import CliError, Exit
from awp_common.processes import launch

# After a second Ctrl-C, how long a process has to stop before it is killed.
HURRY_GRACE_S: Final = 3.0


@dataclass
class Child:
    """One child process and its log file (appended to, so earlier sessions stay)."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    # Where this session's lines start in the log.
    log_offset: int = 0
    restarts: list[float] = field(default_factory=list)
    # Where the stack notes its children, for the next start to find any left running.
    record: Record | None = None

    def start(self) -> None:
        stamp = datetime.now().isoformat(timespec="seconds")
        launched = launch(
            self.argv,
            self.log_path,
            env=self.env,
            banner=f"--- awp dev {stamp}: {' '.join(self.argv)}",
            # If the stack dies without stopping it, it is asked to stop as usual.
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        self.process, self.log_offset = launched.popen, launched.log_offset
        if self.record is not None:
            self.record.add(self.name, self.process.pid)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def log_text(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", "replace")

    def tail(self, lines: int = 8) -> tuple[str, ...]:
        return tuple(self.log_text().splitlines()[-lines:])

    def died(self, code: int) -> CliError:
        return CliError(
            Exit.SERVER,
            f"{self.name} exited with code {code}; its log is {self.log_path}",
            tuple(f"| {line}" for line in self.tail()),
        )


class LogEcho(threading.Thread):
    """Copies new lines of every child's log to the console, prefixed by its name."""

    def __init__(self, children: Callable[[], list[Child]]) -> None:
        super().__init__(name="awp-log-echo", daemon=True)
        self.children = children
        self._done = threading.Event()
        self._positions: dict[Path, int] = {}

    def run(self) -> None:
        while not self._done.wait(0.1):
            self._copy()

    def stop(self) -> None:
        self._done.set()
        self.join(2)
        self._copy()  # the last lines written while stopping

    def _copy(self) -> None:
        for child in self.children():
            start = self._positions.setdefault(child.log_path, child.log_offset)
            with child.log_path.open("rb") as log:
                log.seek(start)
                data = log.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._positions[child.log_path] = start + len(complete)
            for line in complete.decode("utf-8", "replace").splitlines():
                render.stdout.print(
                    Text(f"{child.name:>11} | ", style="cyan") + Text(line), soft_wrap=True
                )


def stop_group(group: list[Child], grace: float, hurry: threading.Event) -> list[str]:
    """SIGTERM to all of a group at once; SIGKILL whatever outlives grace.

    A second Ctrl-C (hurry) sends SIGTERM again, which a draining worker takes as "stop
    now, hand the leases back", and leaves them a few seconds for that.
    """
    running = [c for c in group if c.exit_code() is None]
    for child in running:
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    hurried = False
    while any(c.exit_code() is None for c in running) and time.monotonic() < deadline:
        if hurry.is_set() and not hurried:
            hurried = True
            for child in running:
                child.signal(signal.SIGTERM)
            deadline = min(deadline, time.monotonic() + HURRY_GRACE_S)
        time.sleep(0.05)
    problems = []
    for child in running:
        if child.exit_code() is None:
            child.signal(signal.SIGKILL)
            assert child.process is not None
            child.process.wait(10)
            problems.append(f"{child.name} did not stop in time and was killed")
        elif child.exit_code() not in (0, -signal.SIGTERM):
            problems.append(f"{child.name} exited with code {child.exit_code()} ({child.log_path})")
    return problems
