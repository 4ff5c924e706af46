"""Concurrent Completes share transactions, and each result is still judged on its own."""

from __future__ import annotations

import asyncio

from support import spec, start_run

from awp_db import dispatching, leases, workers
from awp_db.connect import Pool
from awp_kernel.errors import AwpError
from awp_kernel.fencing import ResultVerdict
from awp_server.batching import CompleteBatcher


async def _worker(pool: Pool, name: str) -> workers.Registration:
    async with pool.acquire() as conn:
        return await workers.register(conn, name, 1, ["mock"], 10, {})


async def _claim(pool: Pool, worker: workers.Registration, n: int) -> list[leases.IssuedLease]:
    async with pool.acquire() as conn:
        return await leases.claim(conn, str(worker.worker_id), worker.session_token, n, 60_000)


def _ok(lease: leases.IssuedLease, value: object = 1) -> leases.ResultIn:
    return leases.ResultIn(lease.dispatch_id, lease.lease_token, "succeeded", {"v": value})


async def test_calls_of_several_workers_share_one_transaction(pool: Pool) -> None:
    run_id = await start_run(pool, spec("shared", 12))
    fleet = [await _worker(pool, f"w{i}") for i in range(3)]
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    held = [await _claim(pool, w, 4) for w in fleet]
    async with pool.acquire() as conn:
        revision = await conn.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
        outcomes = await leases.complete_many(
            conn,
            [
                leases.Completion(str(w.worker_id), w.session_token, [_ok(x) for x in mine])
                for w, mine in zip(fleet, held, strict=True)
            ],
        )
        assert outcomes == [[ResultVerdict.ACCEPTED] * 4] * 3
        row = await conn.fetchrow("SELECT state, revision FROM runs WHERE id = $1", run_id)
    # One run lock and one revision bump for all twelve results; the run finished.
    assert (row["state"], row["revision"]) == ("succeeded", revision + 1)


async def test_each_result_is_judged_against_its_own_session(pool: Pool) -> None:
    await start_run(pool, spec("judged", 4))
    alice, bob = await _worker(pool, "alice"), await _worker(pool, "bob")
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    (a1, a2) = await _claim(pool, alice, 2)
    (b1,) = await _claim(pool, bob, 1)
    async with pool.acquire() as conn:
        outcomes = await leases.complete_many(
            conn,
            [
                # Bob reports one of Alice's leases with its real token: not his lease.
                leases.Completion(str(bob.worker_id), bob.session_token, [_ok(b1), _ok(a1)]),
                leases.Completion(str(alice.worker_id), "wrong token", [_ok(a2)]),
            ],
        )
    assert outcomes[0] == [ResultVerdict.ACCEPTED, ResultVerdict.LEASE_LOST]
    assert isinstance(outcomes[1], AwpError) and outcomes[1].reason == "SESSION_INVALID"
    async with pool.acquire() as conn:
        # Alice's leases are untouched: still hers, and her results are accepted later.
        again = await leases.complete(
            conn, str(alice.worker_id), alice.session_token, [_ok(a1), _ok(a2)]
        )
    assert again == [ResultVerdict.ACCEPTED, ResultVerdict.ACCEPTED]


async def test_the_batcher_coalesces_calls_that_would_queue(pool: Pool) -> None:
    await start_run(pool, spec("queued", 40))
    fleet = [await _worker(pool, f"w{i}") for i in range(8)]
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    held = [await _claim(pool, w, 5) for w in fleet]
    batcher = CompleteBatcher(pool, max_results=500, lanes=1)
    answers = await asyncio.gather(
        *(
            batcher.complete(str(w.worker_id), w.session_token, [_ok(x) for x in mine])
            for w, mine in zip(fleet, held, strict=True)
        )
    )
    assert answers == [[ResultVerdict.ACCEPTED] * 5] * 8
    # The first call started alone; the seven that arrived meanwhile went together.
    assert batcher.batches == 2
    # A repeated call is answered DUPLICATE, as without batching.
    w, mine = fleet[0], held[0]
    assert await batcher.complete(str(w.worker_id), w.session_token, [_ok(mine[0])]) == [
        ResultVerdict.DUPLICATE
    ]


async def test_a_call_that_breaks_the_shared_transaction_fails_alone(pool: Pool) -> None:
    await start_run(pool, spec("isolated", 2))
    good, bad = await _worker(pool, "good"), await _worker(pool, "bad")
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    (g,) = await _claim(pool, good, 1)
    (b,) = await _claim(pool, bad, 1)
    batcher = CompleteBatcher(pool, max_results=500, lanes=1)
    blocker = await _worker(pool, "blocker")  # keeps the lane busy so both calls queue
    first = asyncio.create_task(batcher.complete(str(blocker.worker_id), blocker.session_token, []))
    # PostgreSQL refuses \u0000 in jsonb: this result makes its transaction fail.
    calls = await asyncio.gather(
        batcher.complete(str(bad.worker_id), bad.session_token, [_ok(b, "nul \x00 here")]),
        batcher.complete(str(good.worker_id), good.session_token, [_ok(g)]),
        return_exceptions=True,
    )
    await first
    assert batcher.batches == 2  # the two calls were tried together first
    assert isinstance(calls[0], Exception)
    assert calls[1] == [ResultVerdict.ACCEPTED]
