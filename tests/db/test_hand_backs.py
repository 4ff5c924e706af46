"""Hand-backs (DESIGN.md §4): a lease a draining worker gives up is not its task's fault.

It spends no attempt and waits no backoff, up to MAX_FREE_HAND_BACKS per task; past the
bound it is charged as an ordinary interruption. Attempt numbers keep increasing and
every result stays fenced throughout. Driven through awp_db as the server does.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from awp_db import coordination
from awp_db.connect import Pool
from awp_protocol.limits import MAX_FREE_HAND_BACKS
from kit import spec, start_run
from kit.db import DbWorker, register, run_state
from kit.invariants import Expect, check_invariants


async def _task(pool: Pool, run_id: UUID) -> dict[str, Any]:
    row = await pool.fetchrow(
        "SELECT state, attempts, hand_backs, retry_at, ready_at FROM tasks WHERE run_id = $1",
        run_id,
    )
    assert row is not None
    return dict(row)


async def _hand_back_once(pool: Pool, n: int) -> tuple[DbWorker, int]:
    """A fresh worker claims the one task and hands it back; returns it and its attempt."""
    worker = await register(pool, name=f"w{n}")
    (lease,) = await worker.dispatch_and_claim()
    outcome = await worker.drain([lease])
    assert (outcome.state, outcome.active_leases, outcome.handed_back) == ("stopped", 0, 1)
    return worker, lease.attempt


async def _hand_back_events(pool: Pool, run_id: UUID) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        """SELECT attempt, to_state, (payload->'hand_back'->>'charged')::bool AS charged,
                  (payload->'hand_back'->>'free_hand_backs')::int AS free
             FROM state_events
            WHERE run_id = $1 AND type = 'task.state' AND payload ? 'hand_back'
            ORDER BY seq""",
        run_id,
    )
    return [tuple(row) for row in rows]


async def test_a_hand_back_spends_no_attempt_and_waits_no_backoff(pool: Pool) -> None:
    # One attempt and a long backoff: an ordinary interruption would fail the task.
    run_id = await start_run(pool, spec("one-shot", 1, max_attempts=1, backoff_ms=60_000))
    _, first = await _hand_back_once(pool, 1)
    assert first == 1
    task = await _task(pool, run_id)
    assert (task["state"], task["attempts"], task["hand_backs"]) == ("ready", 1, 1)
    assert task["retry_at"] is None and task["ready_at"] is not None
    assert await pool.fetchval(
        "SELECT state FROM attempts WHERE run_id = $1 AND attempt = 1", run_id
    ) == ("interrupted")

    worker = await register(pool, name="w2")
    (lease,) = await worker.dispatch_and_claim()
    # The next attempt has the next number; the hand-back moved the last one up too.
    assert (lease.attempt, lease.max_attempts) == (2, 2)
    assert await worker.complete(lease) == "ACCEPTED"
    assert await run_state(pool, run_id) == "succeeded"
    assert await _hand_back_events(pool, run_id) == [(1, "ready", False, 1)]
    await check_invariants(pool, {run_id: Expect()})


async def test_a_failure_after_a_hand_back_still_has_its_retries(pool: Pool) -> None:
    run_id = await start_run(pool, spec("two", 1, max_attempts=2, backoff_ms=0))
    await _hand_back_once(pool, 1)
    worker = await register(pool, name="w2")
    (second,) = await worker.dispatch_and_claim()
    # Attempt 2 is only the first charged one: its failure is retried.
    assert await worker.complete(second, "failed") == "ACCEPTED"
    assert (await _task(pool, run_id))["state"] == "waiting_retry"
    async with pool.acquire() as conn:
        assert await coordination.release_retries(conn) == 1
    (third,) = await worker.dispatch_and_claim()
    assert (third.attempt, third.max_attempts) == (3, 3)
    assert await worker.complete(third, "failed") == "ACCEPTED"
    assert await run_state(pool, run_id) == "failed"
    await check_invariants(pool, {run_id: Expect("failed", "failed")})


async def test_past_the_bound_a_hand_back_is_charged(pool: Pool) -> None:
    run_id = await start_run(pool, spec("giver-up", 1, max_attempts=2, backoff_ms=0))
    for n in range(1, MAX_FREE_HAND_BACKS + 1):
        _, attempt = await _hand_back_once(pool, n)
        assert attempt == n
        assert (await _task(pool, run_id))["state"] == "ready"

    # The bound is reached: the next hand-back spends the task's first attempt...
    _, attempt = await _hand_back_once(pool, MAX_FREE_HAND_BACKS + 1)
    assert attempt == MAX_FREE_HAND_BACKS + 1
    task = await _task(pool, run_id)
    assert (task["state"], task["hand_backs"]) == ("waiting_retry", MAX_FREE_HAND_BACKS)
    async with pool.acquire() as conn:
        assert await coordination.release_retries(conn) == 1
    # ...and the one after its second and last: the task fails under its retry rule.
    await _hand_back_once(pool, MAX_FREE_HAND_BACKS + 2)
    assert await run_state(pool, run_id) == "failed"

    free = [(n, "ready", False, n) for n in range(1, MAX_FREE_HAND_BACKS + 1)]
    charged = [
        (MAX_FREE_HAND_BACKS + 1, "waiting_retry", True, MAX_FREE_HAND_BACKS),
        (MAX_FREE_HAND_BACKS + 2, "failed", True, MAX_FREE_HAND_BACKS),
    ]
    assert await _hand_back_events(pool, run_id) == free + charged
    numbers = await pool.fetch(
        "SELECT attempt, fencing_token FROM attempts WHERE run_id = $1 ORDER BY attempt", run_id
    )
    assert [row["attempt"] for row in numbers] == list(range(1, MAX_FREE_HAND_BACKS + 3))
    tokens = [row["fencing_token"] for row in numbers]
    assert tokens == sorted(set(tokens))
    await check_invariants(pool, {run_id: Expect("failed", "failed")})


async def test_only_the_holders_current_leases_are_handed_back(pool: Pool) -> None:
    run_id = await start_run(pool, spec("fenced", 2, max_attempts=1))
    holder = await register(pool, name="holder")
    first, second = await holder.dispatch_and_claim()
    assert await holder.complete(first) == "ACCEPTED"
    # A finished lease and a stranger's claim on the other are ignored, not charged.
    stranger = await register(pool, name="stranger")
    outcome = await stranger.drain([second])
    assert (outcome.handed_back, outcome.state) == (0, "stopped")
    outcome = await holder.drain([first, second])
    assert (outcome.handed_back, outcome.charged) == (1, 0)
    task = await pool.fetchrow(
        "SELECT state, hand_backs FROM tasks WHERE run_id = $1 AND key = $2",
        run_id,
        second.task_key,
    )
    assert task is not None and (task["state"], task["hand_backs"]) == ("ready", 1)
