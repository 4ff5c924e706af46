"""The children of `awp dev` (and `awp cluster`) end with it, however it ends.

Two mechanisms, because neither is enough alone:

- A parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, set in the child between fork
  and exec): when the stack's process dies, even by SIGKILL, the kernel sends each child
  the signal its own clean stop is asked with. The kernel ties it to the *thread* that
  started the child, so every child is started from the main thread.
- A record of the children (pid, start time) in the data directory: the next stack on
  that directory stops whatever the record names that is still running (on a system
  without the signal, a child still draining when the next start comes, or a stack of an
  older version), before it starts anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# <linux/prctl.h>
_PR_SET_PDEATHSIG: Final = 1
# How often a stop polls for the processes it signalled to be gone.
_POLL_S: Final = 0.05


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec_fn that has the child sent sig when this thread ends; None where the
    system has no parent-death signal (the record then does the job on the next start)."""
    if not sys.platform.startswith("linux"):
        return None
    # Safe beside the stack's other threads (log echo, file watcher): between fork and
    # exec the child makes two system calls and nothing that takes a lock another
    # thread could hold; the function is looked up here, before the fork.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            # The parent died before the signal was armed: it will never come.
            os._exit(1)

    return preexec


def start_time(pid: int) -> str | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22): with
    the pid, it names one process, never a later one given the same pid. None when the
    process is gone or the system has no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may itself hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has ended; only its parent's wait is missing
        return None
    return fields[19]


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    pid: int
    start: str

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


class Record:
    """The children one stack started, one JSON line each, kept in its data directory
    while it runs and emptied when it stops cleanly."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, name: str, pid: int) -> None:
        start = start_time(pid)
        if start is None:
            return  # already gone, or no /proc: nothing a later start could check
        line = json.dumps({"name": name, "pid": pid, "start": start})
        with self.path.open("a") as out:
            out.write(line + "\n")

    def entries(self) -> list[Entry]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                item = json.loads(line)
                found.append(Entry(str(item["name"]), int(item["pid"]), str(item["start"])))
        return found

    def survivors(self) -> list[Entry]:
        return [entry for entry in self.entries() if entry.alive()]

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def stop_processes(entries: Iterable[Entry], grace: float) -> list[Entry]:
    """SIGTERM to each entry's process group (each child leads its own session), then
    SIGKILL to those still there after grace; returns the ones that needed SIGKILL."""
    running = [entry for entry in entries if entry.alive()]
    for entry in running:
        _signal_group(entry, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(entry.alive() for entry in running) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    killed = [entry for entry in running if entry.alive()]
    for entry in killed:
        _signal_group(entry, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(entry.alive() for entry in killed) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return killed


def _signal_group(entry: Entry, sig: signal.Signals) -> None:
    # The group as well as the process: anything the child started goes with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(entry.pid) == entry.pid:
            os.killpg(entry.pid, sig)
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(entry.pid, sig)
