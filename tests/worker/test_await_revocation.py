"""A SUSPENDED Await ends its lease in the same transaction, so the heartbeat stream's
REVOKED can overtake the Await's own answer. The attempt must still read as suspended
(not revoked, counted and logged as a revocation), and a revocation that was not the
suspension's must still stop it once the answer is known."""

from __future__ import annotations

import asyncio
from typing import Any

from awp.v1 import checkpoints_pb2, types_pb2, worker_pb2
from awp_sdk.replay import Savings
from awp_sdk.waits import WaitSpec
from awp_worker._checkpoints import LeaseCheckpoints


class Answering:
    """The session's call under the lease, answered when the test says so."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def __call__(self, method: str, request: Any) -> Any:
        assert method == "Await"
        self.sent.set()
        return await self.answer


async def overtaken(outcome: int) -> tuple[list[str], list[WaitSpec]]:
    """An Await answered `outcome` after a revocation arrived: what was applied."""
    call = Answering()
    suspended: list[WaitSpec] = []
    store = LeaseCheckpoints(
        worker_pb2.Lease(dispatch_id=7, lease_token="t", attempt=1),
        call,
        on_lost=lambda reason: None,
        log_fields={},
        on_suspended=suspended.append,
    )
    applied: list[str] = []
    spec = WaitSpec(kind="signal", name="go", occurrence=0)
    waiting = asyncio.create_task(store.await_wait(spec, Savings()))
    await call.sent.wait()
    assert store.defer_revocation(lambda: applied.append("revoked"))
    assert applied == []
    call.answer.set_result(
        checkpoints_pb2.AwaitResponse(
            outcome=outcome,
            checkpoint=checkpoints_pb2.Checkpoint(
                kind=types_pb2.CHECKPOINT_KIND_SIGNAL, name="go", value_json="{}"
            ),
        )
    )
    await waiting
    # Outside an Await nothing is held back.
    assert not store.defer_revocation(lambda: applied.append("later"))
    return applied, suspended


async def test_the_suspensions_own_revocation_is_dropped() -> None:
    applied, suspended = await overtaken(checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED)
    assert applied == [] and [spec.name for spec in suspended] == ["go"]


async def test_a_revocation_during_a_satisfied_await_is_applied_after_it() -> None:
    applied, suspended = await overtaken(checkpoints_pb2.AWAIT_OUTCOME_SATISFIED)
    assert applied == ["revoked"] and suspended == []
