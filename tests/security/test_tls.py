"""gRPC over TLS and mutual TLS: a run end to end, clients refused for their
certificates, and the server's certificate rotated under a connected worker."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import grpc
import trustme
from certs import Pem, client_leaf, server_leaf, write_ca
from grpc_health.v1 import health_pb2, health_pb2_grpc

from awp_common.tls import ClientTls, channel
from awp_db import runs
from awp_db.connect import Pool
from awp_worker._config import WorkerConfig
from awp_worker._runtime import WorkerRuntime
from kit import WORKER_TOKEN, ServerFactory, ServerHandle, poll_until, spec, start_run


async def serving(address: str, tls: ClientTls) -> bool:
    """One health check over a fresh channel: whether the server answered at all (the
    handshake worked), whatever the health it reports."""
    async with channel(address, tls) as probe:
        try:
            await health_pb2_grpc.HealthStub(probe).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError:
            return False
    return True


async def run_succeeded(pool: Pool, run_id: Any) -> bool:
    return (await runs.get(pool, run_id)).state == "succeeded"


def worker(server: ServerHandle, ca_file: str, client: Pem | None = None) -> WorkerRuntime:
    return WorkerRuntime(
        WorkerConfig(
            server=server.address,
            worker_token=WORKER_TOKEN,
            name="tls-worker",
            kinds=("mock",),
            claim_wait=0.5,
            tls_ca_file=ca_file,
            tls_cert_file=client.cert if client else None,
            tls_key_file=client.key if client else None,
        )
    )


async def test_a_run_completes_with_every_call_over_mutual_tls(
    start_server: ServerFactory, pool: Pool, coordinator: None, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = write_ca(ca, tmp_path / "ca.pem")
    served = server_leaf(ca, tmp_path)
    server = await start_server(
        tls_cert_file=served.cert, tls_key_file=served.key, tls_client_ca_file=ca_file
    )
    runtime = worker(server, ca_file, client_leaf(ca, tmp_path))
    task = asyncio.create_task(runtime.run())
    try:
        run_id = await start_run(pool, spec("over-tls", 5))
        await poll_until(lambda: run_succeeded(pool, run_id), within=30)
    finally:
        runtime.request_shutdown()
        assert await asyncio.wait_for(task, 30) == 0


async def test_mutual_tls_refuses_a_client_without_a_good_certificate(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    ca, other = trustme.CA(), trustme.CA()
    ca_file = write_ca(ca, tmp_path / "ca.pem")
    served = server_leaf(ca, tmp_path)
    server = await start_server(
        tls_cert_file=served.cert, tls_key_file=served.key, tls_client_ca_file=ca_file
    )
    good = client_leaf(ca, tmp_path, "good")
    assert await serving(server.address, ClientTls(True, ca_file, good.cert, good.key))
    assert not await serving(server.address, ClientTls(True, ca_file))
    foreign = client_leaf(other, tmp_path, "foreign")
    assert not await serving(server.address, ClientTls(True, ca_file, foreign.cert, foreign.key))
    expired = client_leaf(ca, tmp_path, "expired", expired=True)
    assert not await serving(server.address, ClientTls(True, ca_file, expired.cert, expired.key))
    # And a client that does not trust the server's CA refuses the server.
    other_file = write_ca(other, tmp_path / "other.pem")
    assert not await serving(server.address, ClientTls(True, other_file, good.cert, good.key))


async def test_a_rotated_certificate_is_served_while_a_worker_stays_connected(
    start_server: ServerFactory, pool: Pool, coordinator: None, tmp_path: Path
) -> None:
    old, new = trustme.CA(), trustme.CA()
    both = tmp_path / "both.pem"
    write_ca(old, both)
    new.cert_pem.write_to_path(str(both), append=True)
    new_only = write_ca(new, tmp_path / "new.pem")
    live = server_leaf(old, tmp_path, "live")
    server = await start_server(tls_cert_file=live.cert, tls_key_file=live.key)
    runtime = worker(server, str(both))
    task = asyncio.create_task(runtime.run())
    try:
        worker_id = await asyncio.wait_for(runtime.wait_registered(), 20)
        first = await start_run(pool, spec("before", 2))
        await poll_until(lambda: run_succeeded(pool, first), within=30)
        assert not await serving(server.address, ClientTls(True, new_only))
        # Rotated in place, as cert-manager does: the next handshake gets the new one.
        rotated = server_leaf(new, tmp_path, "rotated")
        shutil.copyfile(rotated.key, live.key)
        shutil.copyfile(rotated.cert, live.cert)
        await poll_until(lambda: serving(server.address, ClientTls(True, new_only)), within=20)
        # The worker's connection, made before the rotation, serves on: same session.
        second = await start_run(pool, spec("after", 2))
        await poll_until(lambda: run_succeeded(pool, second), within=30)
        assert runtime.worker_id == worker_id
        sessions = await pool.fetchval("SELECT count(*) FROM workers")
        assert sessions == 1
    finally:
        runtime.request_shutdown()
        assert await asyncio.wait_for(task, 30) == 0
