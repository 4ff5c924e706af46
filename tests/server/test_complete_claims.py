"""A Complete that carries the next Claim (awp_db.cycles): the results settled and the
freed slots leased in one transaction, with Complete's fencing and Claim's guarantee
that no lease is committed for a caller that went away."""

from __future__ import annotations

import asyncio

from awp_db import claims, cycles, leases
from awp_db.connect import Pool
from awp_kernel.fencing import ResultVerdict
from awp_server.batching import CompleteBatcher
from kit import poll_until, spec, start_run
from kit.db import LEASE_TTL_MS, DbWorker, register
from kit.invariants import check_committed


def _ok(lease: claims.IssuedLease, token: str | None = None) -> leases.ResultIn:
    return leases.ResultIn(
        lease.dispatch_id, token or lease.lease_token, "succeeded", {"v": lease.task_key}
    )


def _call(worker: DbWorker, results: list[leases.ResultIn], wish: int) -> cycles.CycleCall:
    return cycles.CycleCall(
        leases.Completion(str(worker.worker_id), worker.session_token, results), wish
    )


async def _leased(pool: Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM dispatches WHERE state = 'leased'")
    return count


async def test_a_chains_next_task_is_leased_in_the_completing_answer(pool: Pool) -> None:
    run_id = await start_run(pool, spec("hop", 3, chain=True))
    worker = await register(pool, max_concurrency=1)
    (first,) = await worker.claim(1)
    assert first.task_key == "t0"
    async with pool.acquire() as conn:
        (answer,) = await cycles.complete_and_claim_many(
            conn, [_call(worker, [_ok(first)], 1)], LEASE_TTL_MS, still_wanted=lambda _: True
        )
    assert isinstance(answer, cycles.CycleAnswer)
    assert answer.verdicts == [ResultVerdict.ACCEPTED]
    (hop,) = answer.issued
    assert (hop.run_id, hop.task_key, hop.upstream_outputs) == (run_id, "t1", {"t0": {"v": "t0"}})
    # Settled, readied, granted and leased by one transaction: t0's end and t1's start
    # (ready -> queued -> running) carry the same transaction id.
    xacts = await pool.fetch(
        "SELECT DISTINCT xmin::text, to_state FROM state_events WHERE run_id = $1"
        " AND (task_key = 't0' AND to_state = 'succeeded'"
        " OR task_key = 't1' AND to_state IN ('ready', 'queued', 'running'))",
        run_id,
    )
    assert len({row["xmin"] for row in xacts}) == 1
    assert {row["to_state"] for row in xacts} == {"succeeded", "ready", "queued", "running"}
    await check_committed(pool)


async def test_a_stale_result_is_refused_while_the_fresh_settle_and_the_claim_happens(
    pool: Pool,
) -> None:
    await start_run(pool, spec("stale", 5))
    worker = await register(pool, max_concurrency=2)
    fresh, stale = await worker.claim(2)
    async with pool.acquire() as conn:
        (answer,) = await cycles.complete_and_claim_many(
            conn,
            [_call(worker, [_ok(fresh), _ok(stale, token="not-its-token")], 2)],
            LEASE_TTL_MS,
            still_wanted=lambda _: True,
        )
    assert isinstance(answer, cycles.CycleAnswer)
    assert answer.verdicts == [ResultVerdict.ACCEPTED, ResultVerdict.LEASE_LOST]
    # One slot freed (the stale lease is still held): one lease, no more.
    assert len(answer.issued) == 1
    assert answer.issued[0].dispatch_id not in {fresh.dispatch_id, stale.dispatch_id}
    assert await _leased(pool) == 2
    await check_committed(pool)


async def test_a_departed_caller_has_its_results_settled_and_no_lease_committed(
    pool: Pool,
) -> None:
    await start_run(pool, spec("departed", 4))
    worker = await register(pool, max_concurrency=1)
    (held,) = await worker.claim(1)
    batcher = CompleteBatcher(pool, max_size=500, lease_ttl_ms=LEASE_TTL_MS)
    call = asyncio.create_task(
        batcher.cycle(str(worker.worker_id), worker.session_token, [_ok(held)], 1)
    )
    # The call is queued (its batch starts at the end of this loop turn); its caller
    # then goes away before the batch's transaction can commit.
    await asyncio.sleep(0)
    call.cancel()

    async def settled() -> bool:
        state = await pool.fetchval("SELECT state FROM dispatches WHERE id = $1", held.dispatch_id)
        return bool(state == "completed")

    await poll_until(settled, "the departed caller's result settled")
    await batcher.close()
    assert call.cancelled()
    assert await _leased(pool) == 0
    # The slot is free: the next Complete (the worker's retry, a duplicate) claims it.
    again = await batcher.cycle(str(worker.worker_id), worker.session_token, [_ok(held)], 1)
    assert again.verdicts == [ResultVerdict.DUPLICATE] and len(again.issued) == 1
    await check_committed(pool)
