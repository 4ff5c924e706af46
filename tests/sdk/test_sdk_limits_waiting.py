"""What a limit holds back now, through the SDK (RateLimits.overview: ListRateLimits)
against a real server, coordinator and worker: a full concurrency key and a rate limit
without free units each count the ready tasks they hold back, and count none once they
let them go (docs/design.md §17, "Watching limits")."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sdk_stack import Stack

from awp_db.connect import Pool
from awp_sdk import ActionContext, Concurrency, Rate, Workflow, action
from awp_sdk.limits import RateLimits
from awp_sdk.records import LimitsOverview, LimitWaiting
from kit import poll_until
from kit.invariants import check_committed

# The test's event that lets the held tasks finish, made in its own loop (the worker runs
# in it).
_released: dict[str, asyncio.Event] = {}


@action("limits.hold")
async def hold(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    await _released["hold"].wait()
    return {}


def keyed() -> Workflow:
    wf = Workflow("limits-keyed", version=1)
    wf.add(
        "hold",
        action="limits.hold",
        kind="python",
        concurrency=[Concurrency("user:{input.user}", max=1)],
    )
    return wf


def rated() -> Workflow:
    wf = Workflow("limits-rated", version=1)
    wf.add("call", action="echo", kind="mock", rate_limits=[Rate("frozen-api", units="2")])
    return wf


async def test_a_held_back_key_and_rate_limit_show_their_waiting_tasks(
    stack: Stack, pool: Pool
) -> None:
    release = _released["hold"] = asyncio.Event()
    async with stack.client() as client:
        limits = RateLimits(client)
        await limits.set("frozen-api", 0, per=timedelta(minutes=1))
        await limits.set("idle-api", 10, per=timedelta(minutes=1))
        await client.apply(keyed())
        await client.apply(rated())
        try:
            held = [await client.start("limits-keyed", input={"user": "ann"}) for _ in range(3)]
            other = await client.start("limits-keyed", input={"user": "bob"})
            frozen = [await client.start("limits-rated") for _ in range(2)]

            async def counted() -> LimitsOverview | None:
                now = await limits.overview()
                keys = now.keys_waiting
                return now if keys == (LimitWaiting("user:ann", 2),) else None

            # One of ann's three runs holds the key (max 1); bob's key is free.
            now = await poll_until(counted, "user:ann to hold back two tasks", within=60)
            assert now.rate_limits_waiting == (LimitWaiting("frozen-api", 2),)
            assert (now.waiting_for("frozen-api"), now.waiting_for("idle-api")) == (2, 0)
            assert [limit.name for limit in now.limits] == ["frozen-api", "idle-api"]
            # Two units each, four granted in the window: the limit lets both go.
            await limits.set("frozen-api", 4, per=timedelta(minutes=1))
            for handle in frozen:
                await handle.result(timeout=60)
            assert (await limits.overview()).rate_limits_waiting == ()
        finally:
            release.set()
        for handle in [*held, other]:
            await handle.result(timeout=60)
        done = await limits.overview()
    assert (done.keys_waiting, done.rate_limits_waiting) == ((), ())
    await check_committed(pool)
