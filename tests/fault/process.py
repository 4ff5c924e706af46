"""One OS process of a fault scenario, started by the shared launcher
(awp_common.processes: its own session and process group, its own log file), killed
however the test ends (the cluster's finalizer, and an atexit hook when pytest itself is
interrupted), and frozen (SIGSTOP) only once the freeze has taken hold."""

from __future__ import annotations

import atexit
import contextlib
import json
import signal
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from awp_common.processes import kill_group, launch, signal_group
from kit import poll_until

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

# Every process group still alive, for the atexit safety net (pytest interrupted by
# Ctrl-C may skip fixture finalizers; orphaned servers would keep ports and databases).
_LIVE: dict[int, subprocess.Popen[bytes]] = {}


@atexit.register
def _kill_leftovers() -> None:
    for pgid, popen in list(_LIVE.items()):
        kill_group(pgid)
        with contextlib.suppress(Exception):
            popen.wait(timeout=5)
    _LIVE.clear()


def _stamp() -> str:
    return datetime.now().strftime("%H:%M:%S.%f")[:-3]


class Process:
    """One OS process of the cluster; can be started again after it ended."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # Offset of this incarnation's output in the log file (restarts append).
        self.log_offset = 0

    def __repr__(self) -> str:
        return f"Process({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def spawn(self) -> None:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._reap()
        self.starts += 1
        banner = f"=== {_stamp()} {self.name} start #{self.starts}: {' '.join(self.argv)}"
        launched = launch(self.argv, self.log_path, env=self.env, banner=banner, cwd=REPO)
        self.popen, self.log_offset = launched.popen, launched.log_offset
        _LIVE[self.popen.pid] = self.popen

    def signal(self, sig: signal.Signals) -> None:
        """Sends sig to the whole process group (a wrapper's children too)."""
        if self.popen is None or self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} is not running")
        self._note(f"signal {sig.name}")
        signal_group(self.popen.pid, sig)

    async def freeze(self) -> None:
        """SIGSTOP, returning once every thread is stopped: from then on the process
        sends nothing new (what it sent before may still be on its way)."""
        self.signal(signal.SIGSTOP)
        pid = self.popen.pid if self.popen is not None else 0
        await poll_until(lambda: _stopped(pid), f"{self.name} to stop", interval=0.002)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9 the process group and reap it: a crash, no cleanup of any kind."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._note("signal SIGKILL")
        kill_group(self.popen.pid)
        self.popen.wait(timeout=10)
        self._reap()

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    async def wait_exit(self, within: float) -> int:
        """The exit code, once the process has ended; fails after `within` seconds."""
        popen = self.popen
        if popen is None:
            raise RuntimeError(f"{self.name} was never started")
        await poll_until(
            lambda: popen.poll() is not None, f"{self.name} to exit", within=within, interval=0.02
        )
        self._reap()
        return popen.returncode

    async def stop(self, within: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL if it is still alive after `within` seconds."""
        if not self.alive:
            self._reap()
            return self.returncode
        self.terminate()
        try:
            return await self.wait_exit(within)
        except AssertionError:
            self.kill()
            return self.returncode

    def output(self, *, current_only: bool = True) -> str:
        """The log text (of this incarnation only, unless told otherwise)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        if current_only:
            data = data[self.log_offset :]
        return data.decode(errors="replace")

    def json_lines(self, *, current_only: bool = True) -> list[dict[str, Any]]:
        """The structured (--log-format json) lines of the log; other lines skipped."""
        found = []
        for line in self.output(current_only=current_only).splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found.append(json.loads(line))
        return found

    def count_logged(self, text: str) -> int:
        """How many structured lines of this incarnation have text in their message."""
        return sum(text in str(line.get("msg", "")) for line in self.json_lines())

    async def logged(self, text: str) -> bool:
        """A wait_for probe: has this incarnation logged a message containing text?"""
        return self.count_logged(text) > 0

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output(current_only=False).splitlines()[-lines:])

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("ab") as log:
            log.write(f"=== {_stamp()} {self.name}: {text}\n".encode())

    def _reap(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            _LIVE.pop(self.popen.pid, None)


def _stopped(pid: int) -> bool:
    """Whether every thread of pid is stopped: SIGSTOP has taken hold, not just been
    sent (until then a thread may still run, and send, on another core)."""
    states = []
    with contextlib.suppress(FileNotFoundError):
        for thread in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                # "pid (comm) S ...": the state follows the last ")" (comm may hold one).
                states.append((thread / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)
