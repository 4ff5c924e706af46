"""Concurrent Claims and Completes share transactions; each call is still served on its own."""

from __future__ import annotations

import asyncio

import pytest

from awp_db import dispatching, leases, workers
from awp_db.connect import Pool
from awp_kernel.errors import AwpError
from awp_kernel.fencing import ResultVerdict
from awp_server.batching import ClaimBatcher, CompleteBatcher
from support import spec, start_run


async def _worker(pool: Pool, name: str) -> workers.Registration:
    async with pool.acquire() as conn:
        return await workers.register(conn, name, 1, ["mock"], 10, {}, heartbeat_interval_ms=5_000)


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
    batcher = CompleteBatcher(pool, max_size=500, lanes=1)
    answers = await asyncio.gather(
        *(
            batcher.complete(str(w.worker_id), w.session_token, [_ok(x) for x in mine])
            for w, mine in zip(fleet, held, strict=True)
        )
    )
    assert answers == [[ResultVerdict.ACCEPTED] * 5] * 8
    # Calls made in one event-loop turn go together.
    assert batcher.batches == 1
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
    batcher = CompleteBatcher(pool, max_size=500, lanes=1)
    # PostgreSQL refuses \u0000 in jsonb: this result makes its transaction fail.
    calls = await asyncio.gather(
        batcher.complete(str(bad.worker_id), bad.session_token, [_ok(b, "nul \x00 here")]),
        batcher.complete(str(good.worker_id), good.session_token, [_ok(g)]),
        return_exceptions=True,
    )
    assert batcher.batches == 1  # tried together first, then one by one
    assert isinstance(calls[0], Exception)
    assert calls[1] == [ResultVerdict.ACCEPTED]


# --- Claims --------------------------------------------------------------------------


async def test_claims_of_several_sessions_share_one_transaction(pool: Pool) -> None:
    run_id = await start_run(pool, spec("claimed", 10))
    alice, bob = await _worker(pool, "alice"), await _worker(pool, "bob")
    async with pool.acquire() as conn:
        await conn.execute("UPDATE workers SET max_concurrency = 3 WHERE id = $1", alice.worker_id)
        await dispatching.create_dispatches(conn)
        revision = await conn.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
        outcomes = await leases.claim_many(
            conn,
            [
                leases.ClaimCall(str(alice.worker_id), alice.session_token, 2),
                leases.ClaimCall(str(bob.worker_id), bob.session_token, 5),
                # Alice again: the two calls share her 3 slots.
                leases.ClaimCall(str(alice.worker_id), alice.session_token, 5),
                leases.ClaimCall(str(bob.worker_id), "wrong token", 1),
            ],
            60_000,
        )
        assert await conn.fetchval("SELECT revision FROM runs WHERE id = $1", run_id) == (
            revision + 1
        )
        holders = await conn.fetch(
            "SELECT worker_id, count(*) AS n FROM attempts GROUP BY worker_id"
        )
    first, second, third, fourth = outcomes
    assert isinstance(first, list) and isinstance(second, list) and isinstance(third, list)
    assert (len(first), len(second), len(third)) == (2, 5, 1)
    assert isinstance(fourth, AwpError) and fourth.reason == "SESSION_INVALID"
    # Every lease belongs to the session that asked, in the database too.
    assert {row["worker_id"]: row["n"] for row in holders} == {
        alice.worker_id: 3,
        bob.worker_id: 5,
    }
    ids = [lease.dispatch_id for lease in [*first, *second, *third]]
    assert len(set(ids)) == len(ids)
    async with pool.acquire() as conn:
        verdicts = await leases.complete(
            conn, str(bob.worker_id), bob.session_token, [_ok(x) for x in second]
        )
    assert verdicts == [ResultVerdict.ACCEPTED] * 5


async def test_a_draining_session_is_refused_alone(pool: Pool) -> None:
    await start_run(pool, spec("drainer", 4))
    keen, leaving = await _worker(pool, "keen"), await _worker(pool, "leaving")
    async with pool.acquire() as conn:
        await conn.execute("UPDATE workers SET state = 'draining' WHERE id = $1", leaving.worker_id)
        await dispatching.create_dispatches(conn)
        outcomes = await leases.claim_many(
            conn,
            [
                leases.ClaimCall(str(leaving.worker_id), leaving.session_token, 2),
                leases.ClaimCall(str(keen.worker_id), keen.session_token, 2),
            ],
            60_000,
        )
    assert isinstance(outcomes[0], AwpError) and outcomes[0].reason == "WORKER_DRAINING"
    assert isinstance(outcomes[1], list) and len(outcomes[1]) == 2


async def test_no_lease_is_committed_for_a_caller_that_went_away(pool: Pool) -> None:
    await start_run(pool, spec("abandoned", 4))
    worker = await _worker(pool, "w")
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
        with pytest.raises(leases.ClaimAbandoned):
            await leases.claim_many(
                conn,
                [leases.ClaimCall(str(worker.worker_id), worker.session_token, 2)],
                60_000,
                still_wanted=lambda index: False,
            )
        assert await conn.fetchval("SELECT count(*) FROM attempts") == 0
        assert await conn.fetchval("SELECT count(*) FROM dispatches WHERE state = 'pending'") == 4


async def test_claims_woken_together_form_one_batch(pool: Pool) -> None:
    await start_run(pool, spec("herd", 20))
    fleet = [await _worker(pool, f"w{i}") for i in range(4)]
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    batcher = ClaimBatcher(pool, max_size=1000, lease_ttl_ms=60_000)
    issued = await asyncio.gather(
        *(batcher.claim(str(w.worker_id), w.session_token, 3) for w in fleet)
    )
    assert [len(batch) for batch in issued] == [3, 3, 3, 3]
    assert batcher.batches == 1


async def test_a_claim_cancelled_while_queued_is_left_out(pool: Pool) -> None:
    await start_run(pool, spec("left", 4))
    first, second = await _worker(pool, "first"), await _worker(pool, "second")
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
    batcher = ClaimBatcher(pool, max_size=1000, lease_ttl_ms=60_000)
    gone = asyncio.create_task(batcher.claim(str(first.worker_id), first.session_token, 2))
    kept = asyncio.create_task(batcher.claim(str(second.worker_id), second.session_token, 2))
    await asyncio.sleep(0)  # both queued; the batch starts at the end of this turn
    gone.cancel()
    assert len(await kept) == 2
    async with pool.acquire() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM attempts WHERE worker_id = $1", first.worker_id
            )
            == 0
        )
