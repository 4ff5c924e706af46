"""awp_common.processes: the one launcher and free-port helper of awp dev, the fault
tests and the benchmark."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from awp_common.processes import clean_env, command, free_ports, kill_group, launch, port_free
from kit import poll_until


def test_free_ports_are_distinct_and_free() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(port_free("127.0.0.1", port) for port in ports)


def test_a_bound_port_is_not_free() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert not port_free("127.0.0.1", taken.getsockname()[1])


def test_clean_env_drops_every_awp_setting() -> None:
    os.environ["AWP_LEAKED_FOR_TEST"] = "1"
    try:
        env = clean_env()
    finally:
        del os.environ["AWP_LEAKED_FOR_TEST"]
    assert not [key for key in env if key.startswith("AWP_")]
    assert env["PYTHONUNBUFFERED"] == "1"


def test_command_runs_the_console_script_beside_this_interpreter() -> None:
    assert command("awp-worker") == [str(Path(sys.executable).with_name("awp-worker"))]


def test_launch_appends_after_a_banner_in_a_session_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    argv = [sys.executable, "-c", "import os; print('pgid', os.getpgid(0))"]
    first = launch(argv, log, env=clean_env(), banner="=== first")
    assert first.popen.wait(10) == 0
    second = launch(argv, log, env=clean_env(), banner="=== second")
    assert second.popen.wait(10) == 0
    text = log.read_text()
    # Both runs kept, each after its banner; each offset starts after its own banner.
    assert text.startswith("=== first\n")
    assert text[second.log_offset :] == f"pgid {second.popen.pid}\n"
    assert text[first.log_offset : second.log_offset] == (f"pgid {first.popen.pid}\n=== second\n")


async def test_kill_group_reaches_every_process_of_the_group(tmp_path: Path) -> None:
    # A wrapper and its child: both must die with the group.
    child = "import time; time.sleep(600)"
    script = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('started', child.pid, flush=True)\n"
        "child.wait()\n"
    )
    log = tmp_path / "group.log"
    launched = launch([sys.executable, "-c", script], log, env=clean_env(), banner="===")
    await poll_until(lambda: "started" in log.read_text(), "the wrapper to start its child")
    kill_group(launched.popen.pid)
    assert launched.popen.wait(10) == -signal.SIGKILL

    def group_gone() -> bool:
        # The orphaned child is reaped by init in its own time: until then it still
        # counts as a member.
        try:
            os.killpg(launched.popen.pid, 0)
        except ProcessLookupError:
            return True
        return False

    await poll_until(group_gone, "every process of the group to be gone", within=10)
