"""RunHandle.stream(): a task's output as it is written, resumed by itself across a
server restart, and by hand from the last position after the reader disconnects."""

from __future__ import annotations

import asyncio

import sdk_flows
from sdk_stack import Stack

from awp_sdk import AttemptBoundary, Client, StreamChunk, StreamItem
from kit import ADMIN_TOKEN, poll_until


def chunks(items: list[StreamItem]) -> list[StreamChunk]:
    return [item for item in items if isinstance(item, StreamChunk)]


async def test_stream_disconnect_and_resume_by_hand(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.chat)
        run = await client.start(sdk_flows.chat, input={"pause": 0.02})
        first: list[StreamItem] = []
        async for item in run.stream("answer"):
            first.append(item)
            if len(chunks(first)) == 10:
                break  # the reader goes away
        resume_at = chunks(first)[-1].position + 1
        rest = [item async for item in run.stream("answer", from_offset=resume_at)]
        outputs = await run.result(timeout=60)

    assert outputs["answer"] == {"tokens": len(sdk_flows.TOKENS)}
    got = chunks(first) + chunks(rest)
    assert [c.position for c in got] == list(range(len(sdk_flows.TOKENS) + 1))
    assert [c.data for c in got] == [*sdk_flows.TOKENS, {"usage": {"tokens": 40}}]
    assert got[-1].is_json
    assert first[0] == AttemptBoundary(1, "started", 0)
    assert rest[-1] == AttemptBoundary(1, "ended", len(got), "succeeded")


async def test_stream_resumes_by_itself_across_a_server_restart(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.chat)
        run = await client.start(sdk_flows.chat, input={"pause": 0.05})
        items: list[StreamItem] = []
        notes: list[str] = []

        async def follow() -> None:
            async for item in client.task_stream(run.id, "answer", on_reconnect=notes.append):
                items.append(item)

        following = asyncio.create_task(follow())
        await poll_until(lambda: len(chunks(items)) >= 5, "the first chunks")
        await stack.restart_server()
        async with asyncio.timeout(60):
            await following

    got = chunks(items)
    assert notes and "resuming at position" in notes[0]
    assert [c.position for c in got] == list(range(len(got))), "a gap or a duplicate"
    succeeded = [b for b in items if isinstance(b, AttemptBoundary) and b.state == "succeeded"]
    assert len(succeeded) == 1
    last = succeeded[0].attempt
    assert [c.data for c in got if c.attempt == last][:-1] == sdk_flows.TOKENS
    # Each boundary once, even though the server repeats them after a resume.
    marks = [(b.attempt, b.kind) for b in items if isinstance(b, AttemptBoundary)]
    assert len(marks) == len(set(marks))


async def test_the_sync_client_streams_too(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.chat)

    def use() -> list[StreamItem]:
        with Client(stack.address, token=ADMIN_TOKEN) as sync:
            run = sync.start(sdk_flows.chat, input={"pause": 0})
            return list(run.stream("answer"))

    items = await asyncio.to_thread(use)
    assert [c.data for c in chunks(items)][:-1] == sdk_flows.TOKENS
