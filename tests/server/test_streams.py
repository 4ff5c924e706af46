"""Output streams over real gRPC and PostgreSQL: AppendStream's fencing and offsets,
WatchStream's order, boundaries and resume (DESIGN.md §15)."""

from __future__ import annotations

import asyncio

import grpc

from awp.v1 import (
    control_pb2_grpc,
    session_pb2,
    streams_pb2,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from awp_db import coordination, retention
from awp_db.connect import Pool
from awp_protocol.limits import MAX_STREAM_BYTES_PER_ATTEMPT, MAX_STREAM_CHUNK_CHARS
from kit import ADMIN, ServerFactory, Stubs, expect_error, poll_until, spec
from kit.db import dispatch_all
from kit.invariants import check_committed
from kit.rawworker import RawWorker, leased

OK = session_pb2.COMPLETE_OUTCOME_ACCEPTED


async def append(
    worker: RawWorker, lease: worker_pb2.Lease, first: int, *texts: str, token: str = ""
) -> streams_pb2.AppendStreamResponse:
    response: streams_pb2.AppendStreamResponse = await worker.stub.AppendStream(
        streams_pb2.AppendStreamRequest(
            session=worker.session,
            dispatch_id=lease.dispatch_id,
            lease_token=token or lease.lease_token,
            first_offset=first,
            chunks=[streams_pb2.StreamChunkIn(text=text) for text in texts],
        ),
        timeout=10,
    )
    return response


def texts(responses: list[streams_pb2.WatchStreamResponse]) -> list[str]:
    return [chunk.text for r in responses for chunk in r.chunks]


def marks(responses: list[streams_pb2.WatchStreamResponse]) -> list[tuple[int, int, int]]:
    return [
        (r.boundary.attempt, r.boundary.kind, r.boundary.state)
        for r in responses
        if r.HasField("boundary")
    ]


async def watch(
    control: control_pb2_grpc.ControlServiceStub, run_id: object, task: str, start: int = 0
) -> list[streams_pb2.WatchStreamResponse]:
    call = control.WatchStream(
        streams_pb2.WatchStreamRequest(run_id=str(run_id), task_key=task, from_offset=start),
        metadata=ADMIN,
        timeout=30,
    )
    return [response async for response in call]


async def test_offsets_are_contiguous_resends_idempotent_and_changes_conflict(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    first = await append(worker, lease, 0, "a", "b")
    assert (first.outcome, first.next_offset) == (OK, 2)
    again = await append(worker, lease, 0, "a", "b")
    assert (again.outcome, again.next_offset) == (session_pb2.COMPLETE_OUTCOME_DUPLICATE, 2)
    grown = await append(worker, lease, 1, "b", "c")  # overlap then a new tail
    assert (grown.outcome, grown.next_offset) == (OK, 3)
    changed = await append(worker, lease, 2, "C")
    assert changed.outcome == session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT
    gap = await expect_error(append(worker, lease, 5, "x"))
    assert (gap.code, gap.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["first_offset"])
    stored = await pool.fetch(
        "SELECT chunk_offset, position, data FROM stream_chunks ORDER BY chunk_offset"
    )
    assert [tuple(r) for r in stored] == [(0, 0, "a"), (1, 1, "b"), (2, 2, "c")]


async def test_an_append_without_the_live_lease_is_lost_and_stores_nothing(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease, other) = await leased(stub, pool, spec(tasks=2), 2)
    forged = await append(worker, lease, 0, "x", token=other.lease_token)
    assert forged.outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = clock_timestamp() WHERE id = $1",
        lease.dispatch_id,
    )
    expired = await append(worker, lease, 0, "x")
    assert expired.outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    assert await worker.complete(other) == OK
    finished = await append(worker, other, 0, "late")
    assert finished.outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
    assert await pool.fetchval("SELECT count(*) FROM stream_chunks") == 0


async def test_limits_are_refused_with_errors_naming_them(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    _, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    too_long = await expect_error(append(worker, lease, 0, "x" * (MAX_STREAM_CHUNK_CHARS + 1)))
    assert (too_long.code, too_long.fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        ["chunks[0].text"],
    )
    big = "y" * MAX_STREAM_CHUNK_CHARS
    per_call = 64
    offset = 0
    while offset * MAX_STREAM_CHUNK_CHARS + per_call * MAX_STREAM_CHUNK_CHARS <= (
        MAX_STREAM_BYTES_PER_ATTEMPT
    ):
        assert (await append(worker, lease, offset, *[big] * per_call)).outcome == OK
        offset += per_call
    over = await expect_error(append(worker, lease, offset, big))
    assert (over.code, over.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STREAM_LIMIT")
    bad_json = await expect_error(
        worker.stub.AppendStream(
            streams_pb2.AppendStreamRequest(
                session=worker.session,
                dispatch_id=lease.dispatch_id,
                lease_token=lease.lease_token,
                first_offset=offset,
                chunks=[streams_pb2.StreamChunkIn(json="{nope")],
            )
        )
    )
    assert bad_json.fields == ["chunks[0].json"]


async def test_a_reader_sees_attempts_framed_and_resumes_without_gap_or_duplicate(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, control = stubs
    run_id, worker, (first,) = await leased(stub, pool, spec(tasks=1, max_attempts=2))
    received: list[streams_pb2.WatchStreamResponse] = []

    async def read() -> None:
        call = control.WatchStream(
            streams_pb2.WatchStreamRequest(run_id=str(run_id), task_key="t0"),
            metadata=ADMIN,
            timeout=30,
        )
        async for response in call:
            received.append(response)

    reader = asyncio.create_task(read())
    assert (await append(worker, first, 0, "par", "tial")).outcome == OK
    await poll_until(lambda: texts(received) == ["par", "tial"], what="live chunks")
    assert await worker.fail(first, "boom", retryable=True) == OK
    async with pool.acquire() as conn:
        assert await coordination.release_retries(conn) == 1  # no backoff: due at once
    await dispatch_all(pool)
    (second,) = await worker.claim()
    assert second.attempt == 2
    assert (await append(worker, second, 0, "whole", " answer")).outcome == OK
    assert await worker.complete(second) == OK
    await asyncio.wait_for(reader, 30)
    assert texts(received) == ["par", "tial", "whole", " answer"]
    started, ended = (
        streams_pb2.STREAM_BOUNDARY_KIND_STARTED,
        streams_pb2.STREAM_BOUNDARY_KIND_ENDED,
    )
    assert marks(received) == [
        (1, started, 0),
        (1, ended, types_pb2.ATTEMPT_STATE_FAILED),
        (2, started, 0),
        (2, ended, types_pb2.ATTEMPT_STATE_SUCCEEDED),
    ]
    positions = [c.position for r in received for c in r.chunks]
    assert positions == [0, 1, 2, 3]
    # Resumed from every position: exactly the rest, in order.
    for start in range(5):
        rest = await watch(control, run_id, "t0", start)
        assert [c.position for r in rest for c in r.chunks] == positions[start:]
    resumed = await watch(control, run_id, "t0", 3)
    assert marks(resumed)[0][0] == 2, "attempt 1's boundaries are behind a reader at 3"
    await check_committed(pool)


async def test_watching_an_unknown_task_names_it(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, control = stubs
    run_id, _, _ = await leased(stub, pool, spec(tasks=1))
    error = await expect_error(watch(control, run_id, "nope"))
    assert (error.code, error.fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["task_key"])
    error = await expect_error(watch(control, "00000000-0000-0000-0000-000000000001", "t0"))
    assert error.reason == "RUN_NOT_FOUND"


async def test_retention_deletes_a_runs_stream_with_it(
    stubs: Stubs,
    pool: Pool,
) -> None:
    stub, _ = stubs
    run_id, worker, (lease,) = await leased(stub, pool, spec(tasks=1))
    assert (await append(worker, lease, 0, "kept until the run goes")).outcome == OK
    assert await worker.complete(lease) == OK
    async with pool.acquire() as conn:
        later = await conn.fetchval("SELECT clock_timestamp() + interval '1 hour'")
        pruned = await retention.prune(conn, later, 10)
    assert pruned.runs == 1
    assert await pool.fetchval("SELECT count(*) FROM stream_chunks") == 0
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = $1", run_id) == 0


async def test_readers_past_the_servers_limit_are_refused(
    start_server: ServerFactory, pool: Pool
) -> None:
    server = await start_server(max_stream_readers=2)
    async with server.channel() as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        control = control_pb2_grpc.ControlServiceStub(channel)
        run_id, _, _ = await leased(stub, pool, spec(tasks=1))
        request = streams_pb2.WatchStreamRequest(run_id=str(run_id), task_key="t0")
        open_calls = [control.WatchStream(request, metadata=ADMIN) for _ in range(2)]
        # Both are open once each has sent its attempt's start.
        for call in open_calls:
            first = await call.read()
            assert first.boundary.kind == streams_pb2.STREAM_BOUNDARY_KIND_STARTED
        error = await expect_error(watch(control, run_id, "t0"))
        assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STREAM_LIMIT")
        open_calls[0].cancel()
        await poll_until(lambda: _opens(control, run_id), what="a reader admitted once one left")
        open_calls[1].cancel()


async def _opens(control: control_pb2_grpc.ControlServiceStub, run_id: object) -> bool:
    call = control.WatchStream(
        streams_pb2.WatchStreamRequest(run_id=str(run_id), task_key="t0"), metadata=ADMIN
    )
    try:
        await call.read()
    except grpc.aio.AioRpcError:
        return False
    finally:
        call.cancel()
    return True
