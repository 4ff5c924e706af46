"""A worker made of the raw generated stubs, for tests of WorkerService itself and for
scenarios that need a worker's secrets (session and lease tokens) or need to send what a
well-behaved worker never would: a late or replayed Complete, a forged lease token.
awp-worker keeps those tokens to itself, as it should."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import grpc

from awp.v1 import session_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from awp_kernel.definition import WorkflowSpec
from kit import WORKER_TOKEN, start_run
from kit.db import dispatch_all
from kit.proto import seconds, struct


class RawWorker:
    def __init__(
        self,
        stub: worker_pb2_grpc.WorkerServiceStub,
        token: str,
        name: str,
        session: session_pb2.Session | None = None,
    ) -> None:
        """A worker of this name; `session` skips Register (a stolen or made-up one)."""
        self.stub: worker_pb2_grpc.WorkerServiceAsyncStub = stub  # type: ignore[assignment]
        self.auth = (("authorization", f"Bearer {token}"),)
        self.name = name
        self.session = session or session_pb2.Session()
        self.interval = 0.25
        self.leases: dict[int, worker_pb2.Lease] = {}
        # Every lease status the heartbeat stream answered: {dispatch_id: [status, ...]}.
        self.answers: dict[int, list[int]] = {}
        self._beating: asyncio.Task[None] | None = None

    async def register(
        self, concurrency: int = 1, kinds: tuple[str, ...] = ("mock",)
    ) -> session_pb2.Session:
        response = await self.stub.Register(
            worker_pb2.RegisterRequest(
                name=self.name,
                protocol_version=1,
                executor_kinds=list(kinds),
                max_concurrency=concurrency,
            ),
            metadata=self.auth,
            timeout=10,
        )
        self.session = response.session
        self.interval = response.heartbeat_interval.ToMilliseconds() / 1000
        return self.session

    def start_heartbeat(self) -> None:
        """Heartbeats every lease held until stop_heartbeat(), like a healthy worker."""

        async def requests() -> AsyncIterator[worker_pb2.HeartbeatRequest]:
            while True:
                refs = [
                    worker_pb2.LeaseRef(dispatch_id=d, lease_token=lease.lease_token)
                    for d, lease in self.leases.items()
                ]
                yield worker_pb2.HeartbeatRequest(session=self.session, leases=refs)
                await asyncio.sleep(self.interval)

        async def beat() -> None:
            call = self.stub.Heartbeat(requests())
            try:
                async for response in call:
                    for state in response.leases:
                        self.answers.setdefault(state.dispatch_id, []).append(state.status)
            finally:
                call.cancel()

        self._beating = asyncio.create_task(beat(), name=f"{self.name}-heartbeat")

    async def stop_heartbeat(self) -> None:
        task, self._beating = self._beating, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task

    async def claim(self, n: int = 1, wait_s: float = 0.0) -> list[worker_pb2.Lease]:
        response = await self.stub.Claim(
            worker_pb2.ClaimRequest(session=self.session, max_leases=n, wait=seconds(wait_s)),
            timeout=wait_s + 10,
        )
        for lease in response.leases:
            self.leases[lease.dispatch_id] = lease
        return list(response.leases)

    async def complete(
        self,
        lease: worker_pb2.Lease,
        output: dict[str, Any] | None = None,
        *,
        token: str = "",
    ) -> int:
        """Reports success for lease (under its own token unless `token` forges one);
        returns the CompleteOutcome (raises on RPC errors)."""
        return await self._report(
            worker_pb2.TaskResult(
                dispatch_id=lease.dispatch_id,
                lease_token=token or lease.lease_token,
                outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
                output=struct(output or {"ok": True}),
            ),
        )

    async def fail(self, lease: worker_pb2.Lease, message: str, retryable: bool) -> int:
        return await self._report(
            worker_pb2.TaskResult(
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                outcome=worker_pb2.RESULT_OUTCOME_FAILED,
                error=types_pb2.TaskError(message=message, retryable=retryable),
            ),
        )

    async def _report(self, result: worker_pb2.TaskResult) -> int:
        response = await self.stub.Complete(
            worker_pb2.CompleteRequest(session=self.session, results=[result]),
            timeout=10,
        )
        outcome: int = response.answers[0].outcome
        return outcome


async def register(
    stub: worker_pb2_grpc.WorkerServiceStub,
    concurrency: int = 4,
    kinds: tuple[str, ...] = ("mock",),
) -> RawWorker:
    """A RawWorker registered with the test server's worker token."""
    worker = RawWorker(stub, WORKER_TOKEN, "test-worker")
    await worker.register(concurrency, kinds)
    return worker


async def leased(
    stub: worker_pb2_grpc.WorkerServiceStub,
    pool: Pool,
    workflow: WorkflowSpec,
    n: int = 1,
    **run: Any,
) -> tuple[UUID, RawWorker, list[worker_pb2.Lease]]:
    """A run of workflow, a registered RawWorker, and the leases of its Claim for n."""
    run_id = await start_run(pool, workflow, **run)
    worker = await register(stub)
    await dispatch_all(pool)
    return run_id, worker, await worker.claim(n)
