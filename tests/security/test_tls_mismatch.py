"""A client and a server that disagree about TLS fail at once with one line naming the
flag to fix: the CLI and the worker, in both directions (never a silent retry loop)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import trustme
from certs import server_leaf, write_ca

from awp_cli.errors import Exit
from kit import ServerFactory, ServerHandle

PLAIN_MEETS_TLS = "the server closed the connection at once: if it serves TLS"
TLS_MEETS_PLAIN = "the TLS handshake failed"
# A bound on the subprocess, not a timing assertion: a retry loop would run past it.
WITHIN_S = 60


@pytest.fixture
async def servers(
    start_server: ServerFactory, tmp_path: Path
) -> tuple[ServerHandle, ServerHandle, str]:
    ca = trustme.CA()
    served = server_leaf(ca, tmp_path)
    tls = await start_server(tls_cert_file=served.cert, tls_key_file=served.key)
    plain = await start_server()
    return tls, plain, write_ca(ca, tmp_path / "ca.pem")


async def run(*argv: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(process.communicate(), WITHIN_S)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_the_cli_says_in_one_line_that_tls_is_on_one_end_only(
    servers: tuple[ServerHandle, ServerHandle, str],
) -> None:
    tls, plain, ca_file = servers
    cli = (sys.executable, "-m", "awp_cli")
    code, err = await run(*cli, "--address", tls.address, "--token", "t", "workers")
    assert code == Exit.SERVER
    assert len(err.splitlines()) == 1 and PLAIN_MEETS_TLS in err, err
    code, err = await run(
        *cli, "--address", plain.address, "--tls-ca-file", ca_file, "--token", "t", "workers"
    )
    assert code == Exit.SERVER
    assert len(err.splitlines()) == 1 and TLS_MEETS_PLAIN in err, err


async def test_the_worker_exits_with_the_reason_instead_of_retrying(
    servers: tuple[ServerHandle, ServerHandle, str],
) -> None:
    tls, plain, ca_file = servers
    worker = (sys.executable, "-m", "awp_worker.main", "--kinds", "mock", "--worker-token", "t")
    code, err = await run(*worker, "--server", tls.address, "--log-format", "text")
    assert code == 2 and PLAIN_MEETS_TLS in err, err
    code, err = await run(
        *worker, "--server", plain.address, "--tls-ca-file", ca_file, "--log-format", "text"
    )
    assert code == 2 and TLS_MEETS_PLAIN in err, err
