"""A worker process that takes one lease and holds it: a victim to kill.

awp-worker keeps its session and lease tokens secret (it never logs them), so a test
that must replay a dead worker's lease needs a worker that tells. This one registers,
opens its heartbeat stream, claims one lease, prints one JSON line with everything a
replay needs, then keeps heartbeating without ever completing -- until it is killed.

    python holder.py SERVER_ADDRESS WORKER_TOKEN NAME
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc

from awp.v1 import worker_pb2, worker_pb2_grpc
from kit.rawworker import RawWorker


async def hold(address: str, token: str, name: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        worker = RawWorker(worker_pb2_grpc.WorkerServiceStub(channel), token, name)
        session = await worker.register()
        worker.start_heartbeat()
        leases: list[worker_pb2.Lease] = []
        while not leases:
            leases = await worker.claim(1, wait_s=5.0)
        lease = leases[0]
        print(
            json.dumps(
                {
                    "holding": True,
                    "worker_id": session.worker_id,
                    "session_token": session.session_token,
                    "dispatch_id": lease.dispatch_id,
                    "lease_token": lease.lease_token,
                    "fencing_token": lease.fencing_token,
                    "run_id": lease.run_id,
                    "task_key": lease.task_key,
                }
            ),
            flush=True,
        )
        await asyncio.Event().wait()  # hold until killed


if __name__ == "__main__":
    asyncio.run(hold(*sys.argv[1:4]))
