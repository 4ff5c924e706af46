"""Reaping: expired leases and passed deadlines, offline workers, retry timers, the
race between a heartbeat's renewal and the reaper, and the completion sweep."""

from __future__ import annotations

import asyncio

from coordinator_support import coordinator, pass_until

from awp_db import coordination, leases
from awp_db.connect import Pool, SessionLimits, connect
from awp_db.workers import OfflineRule
from kit import poll_until, spec, start_run
from kit.db import events_of, register, run_state, task_states
from kit.invariants import check_committed


async def _past(pool: Pool, moment: object) -> bool:
    """True once the database clock is past moment."""
    passed: bool = await pool.fetchval("SELECT clock_timestamp() > $1", moment)
    return passed


async def test_a_lease_being_renewed_is_never_reaped(pool: Pool, database_dsn: str) -> None:
    run_id = await start_run(pool, spec("renewed", 1))
    worker = await register(pool)
    coord = coordinator(pool)
    await coord.run_pass()
    (lease,) = await worker.claim(ttl_ms=3_000)

    # Its transaction stays idle past the lease's expiry and through a pass: longer than
    # the default stall bound (3 s), which would end it first on a busy machine.
    heartbeat = await connect(database_dsn, limits=SessionLimits(10.0))
    try:
        # The heartbeat renews inside a transaction that stays open...
        renewal = heartbeat.transaction()
        await renewal.start()
        ref = leases.LeaseRef(lease.dispatch_id, lease.lease_token)
        (answer,) = await leases.renew(heartbeat, worker.id, [ref], 60_000)
        assert answer.status == "renewed"
        # ...until the old expiry, the one every other snapshot still sees, has passed.
        await poll_until(lambda: _past(pool, lease.lease_expires_at))
        still_old = await pool.fetchval(
            "SELECT lease_expires_at <= clock_timestamp() FROM dispatches WHERE id = $1",
            lease.dispatch_id,
        )
        assert still_old  # so the reaper does see it as a candidate

        report = await coord.run_pass()

        assert (report.interrupted, report.timed_out) == (0, 0)
        await renewal.commit()
    finally:
        await heartbeat.close()

    report = await coord.run_pass()
    assert (report.interrupted, report.timed_out) == (0, 0)
    assert await pool.fetchval("SELECT state FROM dispatches WHERE id = $1", lease.dispatch_id) == (
        "leased"
    )
    assert await worker.complete(lease) == "ACCEPTED"
    assert await run_state(pool, run_id) == "succeeded"
    await check_committed(pool, finished=True)


async def test_a_renewal_waiting_behind_the_reaper_loses(pool: Pool, database_dsn: str) -> None:
    run_id = await start_run(pool, spec("reaped", 1, backoff_ms=60_000))
    worker = await register(pool)
    await coordinator(pool).run_pass()
    (lease,) = await worker.claim(ttl_ms=200)
    await poll_until(lambda: _past(pool, lease.lease_expires_at))

    reaper = await connect(database_dsn)
    heartbeat = await connect(database_dsn)
    try:
        # The reaper settles the lease and holds its transaction open...
        reaping = reaper.transaction()
        await reaping.start()
        reaped = await coordination.reap_expired(reaper)
        assert reaped.interrupted == 1

        # ...while a heartbeat tries to renew. Its condition (lease_expires_at >
        # clock_timestamp()) already fails on the version it reads, so it answers without
        # waiting; were it to find the row valid, it would wait for the reaper's row lock
        # and re-check against the committed, expired row. Either way the reaper wins.
        ref = leases.LeaseRef(lease.dispatch_id, lease.lease_token)
        renewing = asyncio.create_task(leases.renew(heartbeat, worker.id, [ref], 60_000))
        pid = heartbeat.get_server_pid()

        async def answered_or_blocked() -> bool:
            if renewing.done():
                return True
            waiting: str | None = await pool.fetchval(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
            )
            return waiting == "Lock"

        await poll_until(answered_or_blocked)
        await reaping.commit()

        (answer,) = await renewing
        assert answer.status == "revoked"
    finally:
        await reaper.close()
        await heartbeat.close()

    assert await worker.complete(lease) == "LEASE_LOST"
    attempts = await pool.fetch("SELECT state, error FROM attempts")
    assert [(a["state"], a["error"]["message"]) for a in attempts] == [
        ("interrupted", "lease expired")
    ]
    assert await task_states(pool, run_id) == {"t0": "waiting_retry"}
    await check_committed(pool)


async def test_expired_and_timed_out_attempts_retry_then_fail_the_run(pool: Pool) -> None:
    # t0 may run twice; t1 waits for it; t2 is a kind nobody runs, so it stays ready.
    workflow = spec(
        "doomed", 3, max_attempts=2, timeout_ms=2_000, depends={1: [0]}, kinds={2: "python"}
    )
    run_id = await start_run(pool, workflow)
    worker = await register(pool)
    coord = coordinator(pool)
    assert (await coord.run_pass()).dispatched == 1

    # Attempt 1: the lease (100 ms) expires long before the deadline (2 s).
    (first,) = await worker.claim(ttl_ms=100)
    report = await pass_until(coord, lambda r: r.interrupted + r.timed_out > 0)
    assert (report.interrupted, report.timed_out) == (1, 0)
    # Backoff 0: released and dispatched again in the same pass.
    assert (report.retries_released, report.dispatched) == (1, 1)
    assert await worker.complete(first) == "LEASE_LOST"

    # Attempt 2: lease and deadline pass together; the deadline wins.
    (second,) = await worker.claim(ttl_ms=60_000)
    assert second.attempt == 2
    assert second.lease_expires_at == second.attempt_deadline
    report = await pass_until(coord, lambda r: r.interrupted + r.timed_out > 0)
    assert (report.interrupted, report.timed_out, report.runs_finished) == (0, 1, 1)

    assert await run_state(pool, run_id) == "failed"
    assert await task_states(pool, run_id) == {"t0": "failed", "t1": "skipped", "t2": "skipped"}
    attempts = await pool.fetch("SELECT attempt, state, error FROM attempts ORDER BY attempt")
    assert [(a["attempt"], a["state"], a["error"]["message"]) for a in attempts] == [
        (1, "interrupted", "lease expired"),
        (2, "timed_out", "attempt deadline passed"),
    ]
    events = await events_of(pool, run_id)
    assert ("attempt.state", "t0", 1, "running", "interrupted") in events
    assert ("task.state", "t0", 1, "running", "waiting_retry") in events
    assert ("task.state", "t0", None, "waiting_retry", "ready") not in events  # has attempt
    assert ("task.state", "t0", 1, "waiting_retry", "ready") in events
    assert ("attempt.state", "t0", 2, "running", "timed_out") in events
    assert events[-1] == ("run.state", None, None, "running", "failed")
    await check_committed(pool, finished=True)


async def test_silent_workers_go_offline_and_their_leases_are_settled_at_once(
    pool: Pool,
) -> None:
    run_id = await start_run(pool, spec("abandoned", 2, backoff_ms=60_000))
    silent = await register(pool, max_concurrency=1, name="silent")
    lively = await register(pool, max_concurrency=1, name="lively")
    coord = coordinator(pool)  # offline after 3 of each session's own 5 s intervals: 15 s
    assert coord.config.offline_rule == OfflineRule(intervals=3, floor_ms=0)
    intervals = await pool.fetch("SELECT heartbeat_interval_ms FROM workers")
    assert [row["heartbeat_interval_ms"] for row in intervals] == [5_000, 5_000]
    await coord.run_pass()
    (lost,) = await silent.claim()
    (kept,) = await lively.claim()
    await pool.execute(
        "UPDATE workers SET last_heartbeat_at = now() - interval '16 seconds' WHERE id = $1",
        silent.id,
    )

    report = await coord.run_pass()

    assert (report.offline_workers, report.offline_leases) == (1, 1)
    assert await pool.fetchval("SELECT state FROM workers WHERE id = $1", silent.id) == "offline"
    assert await pool.fetchval("SELECT state FROM workers WHERE id = $1", lively.id) == "active"
    rows = await pool.fetch("SELECT dispatch_id, state, error FROM attempts ORDER BY id")
    by_dispatch = {r["dispatch_id"]: r for r in rows}
    assert by_dispatch[lost.dispatch_id]["state"] == "interrupted"
    assert by_dispatch[lost.dispatch_id]["error"]["message"].startswith("worker offline")
    assert by_dispatch[kept.dispatch_id]["state"] == "running"
    assert sorted((await task_states(pool, run_id)).values()) == ["running", "waiting_retry"]
    await check_committed(pool)
    # Once is enough: the next pass finds nothing more to do for that worker.
    again = await coord.run_pass()
    assert (again.offline_workers, again.offline_leases) == (0, 0)


async def test_retry_timers_release_tasks_when_their_backoff_passes(pool: Pool) -> None:
    run_id = await start_run(pool, spec("patient", 1, backoff_ms=1_000))
    worker = await register(pool)
    coord = coordinator(pool)
    await coord.run_pass()
    (lease,) = await worker.claim()
    assert await worker.complete(lease, "failed", retryable=True) == "ACCEPTED"
    assert await task_states(pool, run_id) == {"t0": "waiting_retry"}

    report = await coord.run_pass()
    assert report.retries_released == 0
    # The coordinator knows when to come back: no later than the timer.
    assert report.next_due_in is not None and 0 < report.next_due_in <= 1.0

    report = await pass_until(coord, lambda r: r.retries_released > 0)
    assert (report.retries_released, report.dispatched) == (1, 1)
    (again,) = await worker.claim()
    assert again.attempt == 2
    assert ("task.state", "t0", 1, "waiting_retry", "ready") in await events_of(pool, run_id)
    await check_committed(pool)


async def test_a_non_retryable_failure_is_final(pool: Pool) -> None:
    run_id = await start_run(pool, spec("final", 2, depends={1: [0]}))
    worker = await register(pool)
    coord = coordinator(pool)
    await coord.run_pass()
    (lease,) = await worker.claim()
    assert await worker.complete(lease, "failed", retryable=False) == "ACCEPTED"
    assert await run_state(pool, run_id) == "failed"
    assert await task_states(pool, run_id) == {"t0": "failed", "t1": "skipped"}
    assert not (await coord.run_pass()).did_work


async def test_the_sweep_finishes_runs_whose_tasks_are_all_terminal(pool: Pool) -> None:
    run_id = await start_run(pool, spec("stranded", 2))
    # A run left behind by some path that forgot to finish it.
    await pool.execute(
        "UPDATE tasks SET state = 'succeeded', finished_at = now() WHERE run_id = $1", run_id
    )

    report = await coordinator(pool).run_pass()

    assert report.runs_finished == 1
    assert await run_state(pool, run_id) == "succeeded"
    await check_committed(pool, finished=True)
