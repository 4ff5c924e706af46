"""WatchRun: every event exactly once, in seq order, history then live, ending with the run.

State changes come from the storage layer (as the coordinator and workers make them),
concurrently with the watcher.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from uuid import UUID

import grpc
import pytest

from awp.v1 import control_pb2_grpc, runs_pb2, types_pb2
from awp_db import locks, runs
from awp_db.connect import Pool, connect
from awp_db.events import Event, EventBatch, after_seq
from awp_db.listen import Listener
from awp_server import convert
from control.helpers import control_server, create_workflow, expect_error, start_run, task
from kit.db import converge_cancel, drive_to_end, register

Stub = control_pb2_grpc.ControlServiceStub
# Generous: only ever reached when something is broken.
WITHIN_S = 30.0

CHAIN = [task("a"), task("b", ["a"]), task("c", ["b"])]


class Watch:
    """One WatchRun call, read message by message."""

    def __init__(self, control: Stub, run_id: str, after_seq: int = 0) -> None:
        self.call: Any = control.WatchRun(
            runs_pb2.WatchRunRequest(run_id=run_id, after_seq=after_seq)
        )
        self.events: list[types_pb2.StateEvent] = []
        self.ended = False

    async def read_until(self, seq: int) -> None:
        async with asyncio.timeout(WITHIN_S):
            while not self.events or self.events[-1].seq < seq:
                await self._read_one()
                assert not self.ended, f"the stream ended before seq {seq}"

    async def read_to_end(self) -> list[types_pb2.StateEvent]:
        async with asyncio.timeout(WITHIN_S):
            while not self.ended:
                await self._read_one()
        return self.events

    async def _read_one(self) -> None:
        message = await self.call.read()
        if message is grpc.aio.EOF:
            self.ended = True
        else:
            self.events.append(message.event)


async def stored_events(pool: Pool, run_id: str) -> list[types_pb2.StateEvent]:
    """Every event of the run as stored, in the API's terms."""
    rows = await after_seq(pool, UUID(run_id), 0, limit=10_000)
    return [convert.event_to_proto(row) for row in rows]


@pytest.fixture
async def worker(pool: Pool) -> Any:
    return await register(pool)


async def test_history_then_live_until_the_run_ends(control: Stub, pool: Pool, worker: Any) -> None:
    await create_workflow(control, tasks=CHAIN)
    run = await start_run(control)
    watch = Watch(control, run.id)
    await watch.read_until(run.last_seq)  # the history: created, three tasks

    driver = asyncio.create_task(drive_to_end(pool, UUID(run.id), worker))
    events = await watch.read_to_end()
    assert await driver == "succeeded"

    stored = await stored_events(pool, run.id)
    assert [e.seq for e in events] == list(range(1, len(stored) + 1))
    assert events == stored
    assert (events[-1].type, events[-1].run_transition) == (
        types_pb2.EVENT_TYPE_RUN_STATE,
        types_pb2.RunTransition(
            from_state=types_pb2.RUN_STATE_RUNNING, to_state=types_pb2.RUN_STATE_SUCCEEDED
        ),
    )
    first = events[0]
    assert (first.type, first.run_transition.to_state, first.run_id) == (
        types_pb2.EVENT_TYPE_RUN_CREATED,
        types_pb2.RUN_STATE_RUNNING,
        run.id,
    )
    assert first.run_transition.from_state == types_pb2.RUN_STATE_UNSPECIFIED  # none before
    assert first.HasField("created_at")
    claimed = next(
        e
        for e in events
        if e.type == types_pb2.EVENT_TYPE_ATTEMPT_STATE
        and e.attempt_transition.to_state == types_pb2.ATTEMPT_STATE_RUNNING
    )
    assert claimed.attempt == 1 and claimed.payload.fields["worker_id"].string_value


async def test_reconnect_from_a_seq_misses_and_repeats_nothing(
    control: Stub, pool: Pool, worker: Any
) -> None:
    await create_workflow(control, tasks=CHAIN)
    run = await start_run(control)
    issued = await worker.dispatch_and_claim()

    first = Watch(control, run.id)
    await first.read_until(3)
    first.call.cancel()  # the client goes away mid-stream
    seen = first.events[:3]

    second = Watch(control, run.id, after_seq=seen[-1].seq)
    await second.read_until(seen[-1].seq + 1)

    async def finish() -> None:
        await worker.complete_all(issued)
        await drive_to_end(pool, UUID(run.id), worker)

    driver = asyncio.create_task(finish())
    rest = await second.read_to_end()
    await driver

    combined = [e.seq for e in seen + rest]
    stored = await stored_events(pool, run.id)
    assert combined == list(range(1, len(stored) + 1))
    assert seen + rest == stored


async def test_finished_run_streams_its_history_and_ends(
    control: Stub, pool: Pool, worker: Any
) -> None:
    await create_workflow(control)
    run = await start_run(control)
    await drive_to_end(pool, UUID(run.id), worker)
    last_seq = (await runs.get(pool, UUID(run.id))).last_seq

    events = await Watch(control, run.id).read_to_end()
    assert [e.seq for e in events] == list(range(1, last_seq + 1))
    assert await Watch(control, run.id, after_seq=5).read_to_end() == events[5:]
    assert await Watch(control, run.id, after_seq=last_seq).read_to_end() == []
    assert await Watch(control, run.id, after_seq=last_seq + 100).read_to_end() == []


async def test_a_lost_notification_is_found_by_the_timer(
    pool: Pool, database_dsn: str, worker: Any
) -> None:
    # A listener on a channel nobody notifies: every wake-up is "lost".
    deaf = Listener(database_dsn, ["awp_test_silence"])
    await deaf.start()
    try:
        async with control_server(pool, deaf, watch_poll_s=0.05) as control:
            await create_workflow(control)
            run = await start_run(control)
            watch = Watch(control, run.id)
            await watch.read_until(run.last_seq)
            driver = asyncio.create_task(drive_to_end(pool, UUID(run.id), worker))
            events = await watch.read_to_end()
            await driver
            assert [e.seq for e in events] == list(
                range(1, len(await stored_events(pool, run.id)) + 1)
            )
    finally:
        await deaf.stop()


async def test_watch_errors(control: Stub) -> None:
    await expect_error(
        Watch(control, str(uuid.uuid4())).read_to_end(),
        grpc.StatusCode.NOT_FOUND,
        "RUN_NOT_FOUND",
    )
    await expect_error(
        Watch(control, "nope").read_to_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "run_id",
    )
    await create_workflow(control)
    run = await start_run(control)
    await expect_error(
        Watch(control, run.id, after_seq=2**63).read_to_end(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        "after_seq",
    )


WRITERS = 20
EVENTS_PER_WRITER = 3


async def test_revision_and_seq_stay_contiguous_under_concurrent_writers(
    control: Stub, pool: Pool, database_dsn: str
) -> None:
    await create_workflow(control)
    run = await start_run(control)
    run_id = UUID(run.id)
    watch = Watch(control, run.id)
    await watch.read_until(run.last_seq)

    async def writer(number: int) -> None:
        # Its own connection, as another process would have: the pool stays free for
        # the server, so the watcher keeps reading while the writers queue on the lock.
        conn = await connect(database_dsn)
        try:
            async with conn.transaction():
                await locks.runs(conn, [run_id])
                batch = EventBatch()
                for n in range(EVENTS_PER_WRITER):
                    batch.add(Event(run_id, "test.tick", payload={"writer": number, "n": n}))
                await batch.flush(conn)
        finally:
            await conn.close()

    await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    row = await runs.get(pool, run_id)
    assert row.revision == 1 + WRITERS  # creation, then one per transaction
    assert row.last_seq == run.last_seq + WRITERS * EVENTS_PER_WRITER

    async with pool.acquire() as conn:
        await runs.request_cancel(conn, run_id, "end the watch", "test")
    await converge_cancel(pool, run_id)
    events = await watch.read_to_end()

    stored = await stored_events(pool, run.id)
    assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
    assert events == stored  # every event once, in order, then the end
    assert events[-1].run_transition.to_state == types_pb2.RUN_STATE_CANCELED

    # A type the API cannot name goes out as UNSPECIFIED, without a transition.
    ticks = [e for e in events if e.type == types_pb2.EVENT_TYPE_UNSPECIFIED]
    assert len(ticks) == WRITERS * EVENTS_PER_WRITER
    assert all(e.WhichOneof("transition") is None for e in ticks)
    by_revision: dict[int, list[tuple[int, int]]] = {}
    for e in ticks:
        writer_n = (int(e.payload["writer"]), int(e.payload["n"]))
        by_revision.setdefault(e.revision, []).append(writer_n)
    # Each transaction got one revision, and its events stayed together and in order.
    assert sorted(by_revision) == list(range(2, 2 + WRITERS))
    for writes in by_revision.values():
        assert [n for _, n in writes] == list(range(EVENTS_PER_WRITER))
        assert len({w for w, _ in writes}) == 1
    assert len({writes[0][0] for writes in by_revision.values()}) == WRITERS
    revisions = [e.revision for e in events]
    assert revisions == sorted(revisions)
