"""Every state move the real system records is one DESIGN.md §3 allows.

Runs go through the real entry points (storage calls a worker makes, coordinator
passes): success, retries, a lease that expires, a permanent failure that skips its
dependents, a cancel. Then every run, task and attempt move in state_events is checked
against the lifecycles of tests/lifecycles.py.
"""

from __future__ import annotations

from coordinator_support import coordinator, pass_until

from awp_db import runs
from awp_db.connect import Pool
from kit import spec, start_run
from kit.db import register, run_state
from kit.invariants import check_committed
from kit.lifecycles import EVENT_LIFECYCLES, illegal_moves, recorded_moves


async def test_recorded_moves_follow_the_design_lifecycles(pool: Pool) -> None:
    coord = coordinator(pool)
    worker = await register(pool, max_concurrency=50)
    chain = await start_run(pool, spec("chain", 2, chain=True))
    flaky = await start_run(pool, spec("flaky", 1, max_attempts=3))
    expiring = await start_run(pool, spec("expiring", 1, max_attempts=3))
    doomed = await start_run(pool, spec("doomed", 3, depends={1: [0], 2: [1]}))
    canceled = await start_run(pool, spec("canceled", 2, depends={1: [0]}))
    await coord.run_pass()

    first = {str(lease.run_id): lease for lease in await worker.claim(ttl_ms=60_000)}
    assert len(first) == 5
    assert await worker.complete(first[str(chain)]) == "ACCEPTED"
    assert await worker.complete(first[str(flaky)], "failed", retryable=True) == "ACCEPTED"
    assert await worker.complete(first[str(doomed)], "failed", retryable=False) == "ACCEPTED"
    async with pool.acquire() as conn:
        assert await runs.request_cancel(conn, canceled, "lifecycle test", "test")
    # The expiring run's lease was claimed with a long TTL; shorten it to expire now.
    await pool.execute(
        "UPDATE dispatches SET lease_expires_at = now() WHERE id = $1",
        first[str(expiring)].dispatch_id,
    )
    await pass_until(coord, lambda r: r.interrupted > 0)
    await coord.run_pass()

    for _ in range(3):
        for lease in await worker.claim():
            assert await worker.complete(lease) == "ACCEPTED"
        await coord.run_pass()

    states = {r: await run_state(pool, r) for r in (chain, flaky, expiring, doomed, canceled)}
    assert states == {
        chain: "succeeded",
        flaky: "succeeded",
        expiring: "succeeded",
        doomed: "failed",
        canceled: "canceled",
    }
    moves = await recorded_moves(pool)
    for event_type, (lifecycle, _) in EVENT_LIFECYCLES.items():
        assert illegal_moves(lifecycle, moves[event_type]) == [], event_type
    # The scenarios reached the moves they were built for (the check above is not empty).
    assert {
        ("pending", "ready"),
        ("ready", "queued"),
        ("queued", "running"),
        ("running", "succeeded"),
        ("running", "failed"),
        ("running", "waiting_retry"),
        ("waiting_retry", "ready"),
        ("pending", "skipped"),
        ("running", "canceled"),
        ("pending", "canceled"),
    } <= set(moves["task.state"])
    assert {("running", "succeeded"), ("running", "failed"), ("running", "interrupted")} <= set(
        moves["attempt.state"]
    )
    assert {("running", "succeeded"), ("running", "failed"), ("running", "canceled")} <= set(
        moves["run.state"]
    )
    await check_committed(pool, finished=True)
