"""`awp dev` starts its children with a preexec_fn (the parent-death signal), so each is
a real fork of a process that talks gRPC. With gRPC's fork support on, its fork handler
restarts gRPC's threads in the child on fds that subprocess closes before exec, and now
and then the child aborts before it becomes the coordinator or a worker (grpc/grpc
issue number 43055). The awp process turns that support off (awp_cli/__init__.py): a
child then runs nothing of gRPC's between fork and exec, which it shows by being alone
in its process when its preexec_fn runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.runner import ENV, REPOSITORY

# Forks as `awp dev` does, with a gRPC channel alive (its threads running), and prints
# how many threads the child has when its preexec_fn runs.
PROBE = """
import awp_cli  # first, as the awp entry point imports it
import os, signal, sys
from pathlib import Path
import grpc
from awp_cli.dev.lifetime import die_with_parent
from awp_common.processes import free_port, launch

arm = die_with_parent(signal.SIGTERM)
log = Path(sys.argv[1])

def preexec():
    arm()
    # The child's stderr is the log by now; /proc/self/task lists its threads.
    os.write(2, f"threads {len(os.listdir('/proc/self/task'))}\\n".encode())

with grpc.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
    try:
        channel.unary_unary("/awp.Probe/Nothing")(b"", timeout=2)
    except grpc.RpcError:
        pass  # nothing listens there: the call only gets gRPC's threads going
    child = launch(["true"], log, env=os.environ, banner="probe", preexec_fn=preexec)
    assert child.popen.wait(30) == 0, log.read_text()
print(log.read_text().split("threads ")[1].strip())
"""

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)


def _threads_in_child(tmp_path: Path, env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "child.log")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPOSITORY,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_a_child_of_awp_runs_nothing_of_grpc_before_exec(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    assert _threads_in_child(tmp_path, env) == 1


def test_with_grpc_fork_support_on_the_child_runs_grpc_threads(tmp_path: Path) -> None:
    """The probe's control: what an explicit GRPC_ENABLE_FORK_SUPPORT=true (or an awp
    without the default) gives, the state in which children were seen to abort. Should
    a gRPC release no longer restart its threads in the child, this fails, and the
    default in awp_cli/__init__.py may go."""
    assert _threads_in_child(tmp_path, ENV | {"GRPC_ENABLE_FORK_SUPPORT": "true"}) > 1
