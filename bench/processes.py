"""The benchmark's processes: spawning AWP's binaries with their production defaults,
their CPU and memory, their metrics, and the embedded PostgreSQL's own processes."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import psutil
from prometheus_client.parser import text_string_to_metric_families

from awp_common.processes import clean_env, command, launch

T = TypeVar("T")
BIN = Path(sys.executable).parent
WORKER_CONCURRENCY = 8  # awp-worker's default, passed explicitly so the figure is stated
KINDS = ("server", "coordinator", "worker")


# --- processes ---------------------------------------------------------------------------


def _peak_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_seconds(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


@dataclass
class Proc:
    kind: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    ps: psutil.Process = field(init=False)
    cpu: float = 0.0  # last sample
    peak_rss: int = 0  # last sample of VmHWM

    def __post_init__(self) -> None:
        self.ps = psutil.Process(self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def sample(self) -> None:
        if self.popen.poll() is not None:
            return
        cpu = _cpu_seconds(self.ps)
        if cpu is not None:
            self.cpu = cpu
        rss = _peak_rss_bytes(self.pid)
        if rss is not None:
            self.peak_rss = max(self.peak_rss, rss)


def _cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def spawn(
    kind: str, name: str, args: list[str], logdir: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """One of AWP's binaries, with production defaults: only the flags it is given (and
    the environment variables, e.g. OTEL_*)."""
    return launch_proc(kind, name, [*command(f"awp-{kind}"), *args], logdir, env)


def launch_proc(
    kind: str, name: str, argv: list[str], logdir: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """Any process of the benchmark (AWP's binaries, the session simulator) by the one
    launcher of awp_common.processes, its output in logdir/name.log."""
    log = logdir / f"{name}.log"
    environ = {**clean_env(), **(env or {})}
    launched = launch(argv, log, env=environ, banner=f"=== bench {name}: {' '.join(argv)}")
    return Proc(kind, name, launched.popen, log)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def wait_for(
    probe: Callable[[], Awaitable[T]], what: str, within: float = 60.0, every: float = 0.05
) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:g} s waiting for {what}")
        await asyncio.sleep(every)


class Postgres(Protocol):
    """What the benchmark needs of a PostgreSQL server (embedded, or Debian's 15)."""

    @property
    def dsn(self) -> str: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def log_file(self) -> Path: ...
    def dsn_for(self, database: str) -> str: ...
    def start(self) -> object: ...
    def stop(self, mode: str = ...) -> None: ...


class PgProcesses:
    """CPU of the PostgreSQL server: the postmaster and every process it started."""

    def __init__(self, data_dir: Path) -> None:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        self.postmaster = psutil.Process(pid)
        self.cpu: dict[int, float] = {}

    def sample(self) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in [self.postmaster, *self.postmaster.children()]:
                cpu = _cpu_seconds(proc)
                if cpu is not None:
                    self.cpu[proc.pid] = cpu
