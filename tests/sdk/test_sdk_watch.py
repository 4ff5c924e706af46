"""RunHandle.watch() survives a server restart: the stream resumes after the last seq
seen, so the events arrive once each, in order, with none missing."""

from __future__ import annotations

import asyncio

import sdk_flows
from sdk_stack import Stack

from awp_sdk import Event
from kit import poll_until


async def test_watch_resumes_across_a_server_restart(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.slow)
        run = await client.start(sdk_flows.slow, input={"seconds": 1.5})
        events: list[Event] = []
        notes: list[str] = []

        async def follow() -> None:
            async for event in client.watch(run.id, on_reconnect=notes.append):
                events.append(event)

        following = asyncio.create_task(follow())

        async def running() -> bool:
            return any(e.type == "attempt_state" and e.to_state == "running" for e in events)

        await poll_until(running, "the attempt to start")
        await stack.restart_server()
        async with asyncio.timeout(60):
            await following
        final = await run.get()

    print(f"\nwatch across a restart: {len(events)} events, {len(notes)} reconnect note(s)")
    assert final.run.state == "succeeded"
    assert notes and "resuming after seq" in notes[0]
    assert [e.seq for e in events] == list(range(1, final.run.last_seq + 1))
    assert events[-1].type == "run_state" and events[-1].to_state == "succeeded"
    assert {e.run_id for e in events} == {run.id}
