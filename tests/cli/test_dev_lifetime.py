"""`awp dev` takes its children along, however it ends: `kill -9` of it leaves nothing
running (its server, coordinator, workers and PostgreSQL get their stop signal from the
kernel), and a stack left on a data directory by one that could not take them along is
stopped by the next `awp dev` there before it starts."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from awp_cli.dev.lifetime import Entry, Record, start_time
from awp_db.embedded import EmbeddedPostgres
from cli.devstack import DevStack, launch
from kit import poll_until

# A child drains (workers: up to --shutdown-grace, 10 s in awp dev) with its server
# gone too: what a kill -9 leaves must be gone within this.
GONE_WITHIN_S = 90.0
# What a child that aborted leaves in its log: gRPC's C core failing a check or dying on
# a closed fd (as a child forked by a parent with gRPC's fork support on did, before
# exec: test_dev_fork.py).
ABORTED = re.compile(r"^F\d{4} |Check failed|\.cc:\d+\].*Bad file descriptor", re.MULTILINE)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not under pytest's basetemp: as root, PostgreSQL runs as another user that must
    # traverse the path, and every pytest session resets that tree to mode 0700.
    path = Path(tempfile.mkdtemp(prefix="awp-lifetime-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _postgres_pid(data_dir: Path) -> int:
    return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])


def _assert_no_child_died(dev: DevStack) -> None:
    """None of the children stopped other than when asked: awp dev restarts one that
    exits and says so, and its log keeps what it said."""
    assert "exited with code" not in dev.output(), dev.output()
    for log in sorted(dev.data_dir.glob("logs/*.log")):
        text = log.read_text(errors="replace")
        found = ABORTED.search(text)
        assert found is None, f"{log.name} holds {found[0]!r}:\n{text}"


def _entry(name: str, pid: int) -> Entry:
    start = start_time(pid)
    assert start is not None, f"{name} (pid {pid}) is not running"
    return Entry(name, pid, start)


async def test_kill_9_of_awp_dev_leaves_nothing_running(data_dir: Path) -> None:
    dev = launch(data_dir, "--workers", "2")
    dev.wait_ready()
    children = Record(data_dir / "children.jsonl").entries()
    assert sorted(c.name for c in children) == [
        "console",
        "coordinator",
        "server",
        "worker-1",
        "worker-2",
    ]
    everything = [*children, _entry("postgres", _postgres_pid(data_dir))]
    assert all(entry.alive() for entry in everything)

    dev.process.kill()
    dev.process.wait()
    killed = time.monotonic()
    await poll_until(
        lambda: not [e.name for e in everything if e.alive()],
        "every child of the killed awp dev gone",
        within=GONE_WITHIN_S,
        interval=0.1,
    )
    _assert_no_child_died(dev)
    print(
        f"\nFIGURE kill -9 of awp dev: its {len(everything)} children "
        f"({', '.join(e.name for e in everything)}) all gone after "
        f"{time.monotonic() - killed:.1f} s"
    )


def test_a_stale_stack_is_stopped_at_the_next_start(data_dir: Path) -> None:
    """What a stack could not take along (an older version, a system without the
    parent-death signal): a PostgreSQL daemonised by pg_ctl, and recorded children that
    outlived it. The next awp dev stops both; a recorded pid now naming another process
    (same pid, another start time) is left alone."""
    postgres = EmbeddedPostgres(data_dir / "pg", unsafe_fast=True).start()
    old_pid = _postgres_pid(data_dir)
    # The stale children: processes of their own session, as the stack starts them.
    stale = [
        subprocess.Popen(["sleep", "600"], start_new_session=True),
        subprocess.Popen(["sleep", "600"], start_new_session=True),
    ]
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    record = Record(data_dir / "children.jsonl")
    record.add("worker-1", stale[0].pid)
    record.add("server", stale[1].pid)
    with record.path.open("a") as out:  # the bystander's pid, from before it was reused
        out.write(f'{{"name": "worker-2", "pid": {bystander.pid}, "start": "1"}}\n')
    try:
        dev = launch(data_dir, "--workers", "1")
        dev.wait_ready()
        output = dev.output()
        assert "stopping what an earlier stack left running: " in output, output
        assert f"worker-1 (pid {stale[0].pid})" in output
        assert f"server (pid {stale[1].pid})" in output
        assert "worker-2" not in output.split("left running: ")[1].splitlines()[0]
        assert "stopping a PostgreSQL left running by an earlier awp dev" in output
        for process in stale:
            assert process.wait(5) is not None  # ended by the new stack, reaped here
        assert bystander.poll() is None, "a process that only shares a recorded pid was hit"
        assert _postgres_pid(data_dir) != old_pid
        assert dev.stop() == 0, dev.output()
        _assert_no_child_died(dev)
        assert not record.path.exists(), "a clean stop leaves no record"
    finally:
        bystander.kill()
        bystander.wait()
        for process in stale:
            process.kill()
            process.wait()
        postgres.stop(mode="immediate")
