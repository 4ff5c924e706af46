"""The Node.js example worker over mutual TLS: the protocol's TLS is not Python's alone."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import pytest
import trustme
from certs import client_leaf, server_leaf, write_ca

from awp_db import runs
from awp_db.connect import Pool
from kit import WORKER_TOKEN, ServerFactory, poll_until, spec, start_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node-worker"


async def test_the_node_worker_completes_a_run_over_mutual_tls(
    start_server: ServerFactory, pool: Pool, coordinator: None, tmp_path: Path
) -> None:
    if not (EXAMPLE / "node_modules").is_dir() or shutil.which("node") is None:
        pytest.fail("the Node worker needs node and `npm ci` in examples/node-worker (.ci/run)")
    ca = trustme.CA()
    ca_file = write_ca(ca, tmp_path / "ca.pem")
    served = server_leaf(ca, tmp_path)
    server = await start_server(
        tls_cert_file=served.cert, tls_key_file=served.key, tls_client_ca_file=ca_file
    )
    pem = client_leaf(ca, tmp_path, "node-worker")
    node = await asyncio.create_subprocess_exec(
        "node", "worker.js", "--server", server.address, "--worker-token", WORKER_TOKEN,
        "--tls-ca-file", ca_file, "--tls-cert-file", pem.cert, "--tls-key-file", pem.key,
        cwd=EXAMPLE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        run_id = await start_run(pool, spec("node-over-tls", 3))

        async def succeeded() -> bool:
            return (await runs.get(pool, run_id)).state == "succeeded"

        await poll_until(succeeded, within=60)
    finally:
        node.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(node.communicate(), 60)
    assert node.returncode == 0, out.decode()[-2000:]
