"""Concurrent Claims, Completes and heartbeats share transactions; each call is still
served on its own."""

from __future__ import annotations

import asyncio
from uuid import UUID

import pytest
from asyncpg import Connection
from asyncpg.exceptions import LockNotAvailableError

from awp_db import claims, dispatching, leases, workers
from awp_db.connect import Pool, SessionLimits, connect, create_pool
from awp_kernel.errors import AwpError, ErrorKind
from awp_kernel.fencing import ResultVerdict
from awp_server.batching import ClaimBatcher, CompleteBatcher, TouchBatcher
from awp_server.errors import as_awp_error
from kit import poll_until, spec, start_run
from kit.db import DbWorker, dispatch_all, register


def _ok(lease: claims.IssuedLease, value: object = 1) -> leases.ResultIn:
    return leases.ResultIn(lease.dispatch_id, lease.lease_token, "succeeded", {"v": value})


async def test_calls_of_several_workers_share_one_transaction(pool: Pool) -> None:
    run_id = await start_run(pool, spec("shared", 12))
    fleet = [await register(pool, name=f"w{i}") for i in range(3)]
    await dispatch_all(pool)
    held = [await w.claim(4) for w in fleet]
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
    alice, bob = await register(pool, name="alice"), await register(pool, name="bob")
    await dispatch_all(pool)
    (a1, a2) = await alice.claim(2)
    (b1,) = await bob.claim(1)
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
        (again,) = await leases.complete_many(
            conn, [leases.Completion(str(alice.worker_id), alice.session_token, [_ok(a1), _ok(a2)])]
        )
    assert again == [ResultVerdict.ACCEPTED, ResultVerdict.ACCEPTED]


async def test_the_batcher_coalesces_calls_that_would_queue(pool: Pool) -> None:
    await start_run(pool, spec("queued", 40))
    fleet = [await register(pool, name=f"w{i}") for i in range(8)]
    await dispatch_all(pool)
    held = [await w.claim(5) for w in fleet]
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


async def test_heartbeats_of_many_sessions_are_recorded_by_one_statement(pool: Pool) -> None:
    fleet = [await register(pool, name=f"w{i}") for i in range(30)]
    gone = await register(pool, name="gone")
    async with pool.acquire() as conn:
        await workers.mark_offline(conn, [gone.worker_id])
        before = await conn.fetchval("SELECT max(last_heartbeat_at) FROM workers")
    batcher = TouchBatcher(pool, max_size=1000)
    states = await asyncio.gather(*(batcher.touch(w.worker_id) for w in [*fleet, gone]))
    # Each session answered as on its own; the offline one is no longer live.
    assert states == ["active"] * 30 + [None]
    assert batcher.batches == 1
    async with pool.acquire() as conn:
        seen = await conn.fetch(
            "SELECT name, last_heartbeat_at > $1 AS touched FROM workers", before
        )
    assert {row["name"] for row in seen if row["touched"]} == {f"w{i}" for i in range(30)}


async def test_heartbeats_arriving_one_after_another_wait_for_one_window(pool: Pool) -> None:
    # Heartbeats arrive spread out, not in one loop turn: without the linger the first
    # would start its own statement at once and the rest would follow in another.
    fleet = [await register(pool, name=f"w{i}") for i in range(3)]
    batcher = TouchBatcher(pool, max_size=1000)
    touches = []
    for w in fleet:
        touches.append(asyncio.ensure_future(batcher.touch(w.worker_id)))
        for _ in range(5):
            await asyncio.sleep(0)  # loop turns: a linger-less batch would start here
    assert await asyncio.gather(*touches) == ["active"] * 3
    assert batcher.batches == 1


async def test_a_call_that_breaks_the_shared_transaction_fails_alone(pool: Pool) -> None:
    await start_run(pool, spec("isolated", 2))
    good, bad = await register(pool, name="good"), await register(pool, name="bad")
    await dispatch_all(pool)
    (g,) = await good.claim(1)
    (b,) = await bad.claim(1)
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
    alice, bob = await register(pool, name="alice"), await register(pool, name="bob")
    async with pool.acquire() as conn:
        await conn.execute("UPDATE workers SET max_concurrency = 3 WHERE id = $1", alice.worker_id)
        await dispatching.create_dispatches(conn)
        revision = await conn.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
        outcomes = await claims.claim_many(
            conn,
            [
                claims.ClaimCall(str(alice.worker_id), alice.session_token, 2),
                claims.ClaimCall(str(bob.worker_id), bob.session_token, 5),
                # Alice again: the two calls share her 3 slots.
                claims.ClaimCall(str(alice.worker_id), alice.session_token, 5),
                claims.ClaimCall(str(bob.worker_id), "wrong token", 1),
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
        (verdicts,) = await leases.complete_many(
            conn,
            [leases.Completion(str(bob.worker_id), bob.session_token, [_ok(x) for x in second])],
        )
    assert verdicts == [ResultVerdict.ACCEPTED] * 5


async def test_a_draining_session_is_refused_alone(pool: Pool) -> None:
    await start_run(pool, spec("drainer", 4))
    keen, leaving = await register(pool, name="keen"), await register(pool, name="leaving")
    async with pool.acquire() as conn:
        await conn.execute("UPDATE workers SET state = 'draining' WHERE id = $1", leaving.worker_id)
        await dispatching.create_dispatches(conn)
        outcomes = await claims.claim_many(
            conn,
            [
                claims.ClaimCall(str(leaving.worker_id), leaving.session_token, 2),
                claims.ClaimCall(str(keen.worker_id), keen.session_token, 2),
            ],
            60_000,
        )
    assert isinstance(outcomes[0], AwpError) and outcomes[0].reason == "WORKER_DRAINING"
    assert isinstance(outcomes[1], list) and len(outcomes[1]) == 2


async def test_no_lease_is_committed_for_a_caller_that_went_away(pool: Pool) -> None:
    await start_run(pool, spec("abandoned", 4))
    worker = await register(pool, name="w")
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)
        with pytest.raises(claims.ClaimAbandoned):
            await claims.claim_many(
                conn,
                [claims.ClaimCall(str(worker.worker_id), worker.session_token, 2)],
                60_000,
                still_wanted=lambda index: False,
            )
        assert await conn.fetchval("SELECT count(*) FROM attempts") == 0
        assert await conn.fetchval("SELECT count(*) FROM dispatches WHERE state = 'pending'") == 4


async def test_claims_woken_together_form_one_batch(pool: Pool) -> None:
    await start_run(pool, spec("herd", 20))
    fleet = [await register(pool, name=f"w{i}") for i in range(4)]
    await dispatch_all(pool)
    batcher = ClaimBatcher(pool, max_size=1000, lease_ttl_ms=60_000)
    issued = await asyncio.gather(
        *(batcher.claim(str(w.worker_id), w.session_token, 3) for w in fleet)
    )
    assert [len(batch) for batch in issued] == [3, 3, 3, 3]
    assert batcher.batches == 1


async def test_a_claim_cancelled_while_queued_is_left_out(pool: Pool) -> None:
    await start_run(pool, spec("left", 4))
    first, second = await register(pool, name="first"), await register(pool, name="second")
    await dispatch_all(pool)
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


# --- bounded waits (DESIGN.md §6) ----------------------------------------------------


async def _hold_run_lock(dsn: str, run_id: UUID, limits: SessionLimits | None) -> Connection:
    """A session that locks a run row and then stalls inside its transaction."""
    holder = await connect(dsn, application_name="stalled-holder", limits=limits)
    await holder.execute("BEGIN")
    await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", run_id)
    return holder


async def _one_lease(pool: Pool, name: str) -> tuple[UUID, DbWorker, claims.IssuedLease]:
    """A one-task run whose task is leased to a worker of its own."""
    run_id = await start_run(pool, spec(name, 1))
    worker = await register(pool, name=name)
    await dispatch_all(pool)
    (lease,) = await worker.claim(1)
    return run_id, worker, lease


async def test_a_stalled_lock_holder_is_dropped_and_other_calls_do_not_wait(
    pool: Pool, database_dsn: str
) -> None:
    stuck_run, a, behind = await _one_lease(pool, "stuck")
    _, b, elsewhere = await _one_lease(pool, "free")
    limits = SessionLimits(1.0)
    holder = await _hold_run_lock(database_dsn, stuck_run, limits)
    batcher = CompleteBatcher(pool, max_size=500, limits=limits)
    stuck = asyncio.create_task(batcher.complete(str(a.worker_id), a.session_token, [_ok(behind)]))
    await poll_until(lambda: batcher.straggled == 1, "the stuck batch to give up its lane")
    # The one lane is taken by a transaction that waits: another run's call goes on.
    assert await batcher.complete(str(b.worker_id), b.session_token, [_ok(elsewhere)]) == [
        ResultVerdict.ACCEPTED
    ]
    assert not stuck.done()
    # PostgreSQL ends the stalled holder's session after the stall bound; its lock goes
    # with it and the waiting call is served, within its deadline.
    assert await asyncio.wait_for(stuck, limits.transaction_s) == [ResultVerdict.ACCEPTED]
    assert batcher.abandoned == 0
    sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'stalled-holder'"
    assert await pool.fetchval(sessions) == 0
    holder.terminate()


async def test_a_transaction_past_its_deadline_is_unavailable_and_loses_nothing(
    database_dsn: str, pool: Pool
) -> None:
    run_id, worker, lease = await _one_lease(pool, "deadline")
    # The database itself would let both sessions wait for minutes: the deadline is the
    # batcher's own (as when PostgreSQL cannot be reached at all).
    patient = await create_pool(database_dsn, min_size=1, max_size=4, limits=SessionLimits(100))
    holder = await _hold_run_lock(database_dsn, run_id, None)
    try:
        batcher = CompleteBatcher(patient, max_size=500, limits=SessionLimits(0.4))
        call = (str(worker.worker_id), worker.session_token, [_ok(lease)])
        with pytest.raises(TimeoutError) as raised:
            await asyncio.wait_for(batcher.complete(*call), 10)
        error = as_awp_error(raised.value)
        assert error is not None and error.kind is ErrorKind.UNAVAILABLE
        assert batcher.abandoned == 1
        assert await pool.fetchval("SELECT state FROM attempts") == "running"
        await holder.execute("ROLLBACK")
        # The worker's retry is served as the first call would have been.
        assert await batcher.complete(*call) == [ResultVerdict.ACCEPTED]
    finally:
        holder.terminate()
        await asyncio.wait_for(patient.close(), 10)


async def test_a_lock_timeout_is_unavailable_and_issues_nothing(
    database_dsn: str, pool: Pool
) -> None:
    run_id = await start_run(pool, spec("locked", 2))
    worker = await register(pool, name="w")
    await dispatch_all(pool)
    limits = SessionLimits(0.3)  # lock_timeout 0.45 s, before the 0.9 s deadline
    short = await create_pool(database_dsn, min_size=1, max_size=4, limits=limits)
    holder = await _hold_run_lock(database_dsn, run_id, None)
    try:
        batcher = ClaimBatcher(short, max_size=1000, lease_ttl_ms=60_000, limits=limits)
        with pytest.raises(LockNotAvailableError) as raised:
            await batcher.claim(str(worker.worker_id), worker.session_token, 2)
        error = as_awp_error(raised.value)
        assert error is not None and error.kind is ErrorKind.UNAVAILABLE
        assert await pool.fetchval("SELECT count(*) FROM attempts") == 0
        await holder.execute("ROLLBACK")
        assert len(await batcher.claim(str(worker.worker_id), worker.session_token, 2)) == 2
    finally:
        holder.terminate()
        await asyncio.wait_for(short.close(), 10)
