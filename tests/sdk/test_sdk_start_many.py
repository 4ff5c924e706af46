"""AsyncClient.start_many / Client.start_many (StartRuns) against a real awp-server,
coordinator and Python worker: the runs start together and finish, a retried batch
answers the same runs, and a bad entry is refused by name with nothing started."""

from __future__ import annotations

import asyncio

import pytest
import sdk_flows
from sdk_stack import Stack

from awp_sdk import Client, InvalidArgument, RunRequest
from kit import ADMIN_TOKEN


async def test_runs_started_together_finish_and_a_retry_finds_them(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.steps)
        requests = [RunRequest(sdk_flows.steps, request_id=f"batch-{i}") for i in range(20)]
        handles = await client.start_many(requests)
        assert len({h.id for h in handles}) == 20 and all(h.created for h in handles)
        await asyncio.gather(*(handle.result(timeout=60) for handle in handles))
        again = await client.start_many(requests)
        assert [h.id for h in again] == [h.id for h in handles]
        assert not any(h.created for h in again)


async def test_a_bad_entry_is_named_and_nothing_starts(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.steps)
        with pytest.raises(InvalidArgument) as refused:
            await client.start_many(
                [RunRequest(sdk_flows.steps), RunRequest(sdk_flows.steps, priority=99)]
            )
        assert "runs[1].priority" in str(refused.value)
        assert [run async for run in client.list_runs()] == []


async def test_the_sync_client_starts_many(stack: Stack) -> None:
    def use() -> list[bool]:
        with Client(stack.address, token=ADMIN_TOKEN) as client:
            client.apply(sdk_flows.steps)
            handles = client.start_many([RunRequest("sdk-steps") for _ in range(3)])
            return [bool(handle.result(timeout=60)) for handle in handles]

    assert await asyncio.to_thread(use) == [True] * 3
