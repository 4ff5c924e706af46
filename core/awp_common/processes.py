"""Local AWP processes and the ports they listen on: the one launcher and the one free-port
helper of `awp dev` (awp_cli.dev), the embedded PostgreSQL, the fault tests and the
benchmark.

Every child runs in its own session, so that its process group can be signalled as a
whole and a terminal's Ctrl-C reaches only the parent, which stops its children in the
order it chooses. Its stdout and stderr are appended to one log file, after a banner
line, so a restarted child's earlier output stays and its own starts at a known offset.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# The console scripts of pyproject.toml: run from beside this interpreter when installed,
# else through the interpreter (a source checkout on PYTHONPATH). Module names only: this
# layer imports none of them.
ENTRY_POINTS: Final = {
    "awp-server": "awp_server.main",
    "awp-coordinator": "awp_coordinator.main",
    "awp-worker": "awp_worker.main",
    "awp": "awp_cli.main",
}


def command(script: str) -> list[str]:
    """The argv that runs one of AWP's console scripts, as an operator would."""
    beside = Path(sys.executable).with_name(script)
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    module = ENTRY_POINTS[script]
    return [
        sys.executable,
        "-c",
        f"import sys; sys.argv[0] = {script!r}; from {module} import main; sys.exit(main())",
    ]


def clean_env() -> dict[str, str]:
    """This process's environment less every AWP_* setting (a child gets only the flags
    it is given: production defaults), with Python's output unbuffered so that a log
    file is current when it is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class Launched:
    popen: subprocess.Popen[bytes]
    # Where this start's output begins in the log (after its banner).
    log_offset: int


def launch(
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str],
    banner: str,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Launched:
    """Starts argv in a session of its own, appending its output to log_path after the
    banner line. preexec_fn runs in the child before exec (say, to end with the parent)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"{banner}\n".encode())
        log.flush()
        log_offset = log.tell()
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,  # noqa: PLW1509 (the caller's choice, e.g. die with it)
        )
    return Launched(popen, log_offset)


def signal_group(pgid: int, sig: int) -> bool:
    """Sends sig to a launched process's whole group; False if it is already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_group(pgid: int) -> None:
    """kill -9 the group: a crash, no cleanup of any kind."""
    signal_group(pgid, signal.SIGKILL)


def free_port(host: str = "127.0.0.1") -> int:
    (port,) = free_ports(1, host)
    return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct free ports: each socket stays bound until all are chosen, so the kernel
    cannot hand the same port out twice (one released port is the next one's favourite)."""
    sockets = [socket.socket(_family(host)) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now."""
    with socket.socket(_family(host)) as sock:
        # As the servers do: a port left in TIME_WAIT by the last run is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
