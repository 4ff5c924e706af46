"""A bare-bones worker process that takes one lease and holds it: a victim to kill.

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
from collections.abc import AsyncIterator

import grpc
from google.protobuf import duration_pb2

from awp.v1 import worker_pb2, worker_pb2_grpc


async def hold(address: str, token: str, name: str) -> None:
    auth = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        registered = await stub.Register(
            worker_pb2.RegisterRequest(
                name=name, protocol_version=1, executor_kinds=["mock"], max_concurrency=1
            ),
            metadata=auth,
        )
        session = registered.session
        interval = registered.heartbeat_interval.ToMilliseconds() / 1000
        held: list[worker_pb2.LeaseRef] = []

        async def beats() -> AsyncIterator[worker_pb2.HeartbeatRequest]:
            while True:
                yield worker_pb2.HeartbeatRequest(session=session, leases=held)
                await asyncio.sleep(interval)

        stream = stub.Heartbeat(beats())
        wait = duration_pb2.Duration()
        wait.FromSeconds(5)
        while not held:
            claimed = await stub.Claim(
                worker_pb2.ClaimRequest(session=session, max_leases=1, wait=wait)
            )
            for lease in claimed.leases:
                held.append(
                    worker_pb2.LeaseRef(
                        dispatch_id=lease.dispatch_id, lease_token=lease.lease_token
                    )
                )
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
        async for _ in stream:
            pass  # answers are irrelevant: this worker only exists to be killed


if __name__ == "__main__":
    asyncio.run(hold(*sys.argv[1:4]))
