"""The wait rules of the invariant checker (kit/invariants/waits.py) have teeth: a
signal consumed by no wait, a wait that consumed no signal, a payload that is not the
signal's, signals consumed out of order, and a suspended attempt charged are each named
(storage layer only: fast, not `fault`)."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_db import waits
from awp_db.connect import Pool
from awp_protocol.results import Replayed
from kit import spec, start_run
from kit.db import register
from kit.invariants import InvariantViolation, check_committed


async def _resumed(pool: Pool) -> UUID:
    """A task that suspended at a signal wait and was resumed by one signal, and a
    second signal of that name left buffered; its run."""
    run_id = await start_run(pool, spec(tasks=1))
    worker = await register(pool, name="checker")
    (lease,) = await worker.dispatch_and_claim()
    async with pool.acquire() as conn:
        awaited = await waits.await_wait(
            conn,
            worker.worker_id,
            lease.dispatch_id,
            lease.lease_token,
            waits.Wait("signal", "go", 0, None),
            Replayed(),
        )
        assert awaited.outcome is waits.AwaitOutcome.SUSPENDED
        sent = await waits.send_signal(conn, run_id, "go", '{"n": 1}', None, "test")
        assert sent.delivered_to == "t0"
        await waits.send_signal(conn, run_id, "go", '{"n": 2}', None, "test")
    return run_id


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_resumed_wait_and_a_buffered_signal_pass(pool: Pool) -> None:
    await _resumed(pool)
    await check_committed(pool)


async def test_a_signal_consumed_twice_is_found(pool: Pool) -> None:
    run_id = await _resumed(pool)
    await pool.execute(
        "UPDATE signals SET consumed_by_task = (SELECT id FROM tasks WHERE run_id = $1),"
        " consumed_at = now() WHERE run_id = $1 AND consumed_at IS NULL",
        run_id,
    )
    assert "a signal consumed by no wait of the task" in await _violations(pool)


async def test_a_wait_that_consumed_no_signal_is_found(pool: Pool) -> None:
    run_id = await _resumed(pool)
    await pool.execute(
        "UPDATE signals SET consumed_by_task = NULL, consumed_at = NULL WHERE run_id = $1",
        run_id,
    )
    assert "a satisfied signal wait that consumed no signal" in await _violations(pool)


async def test_a_payload_not_the_signals_is_found(pool: Pool) -> None:
    run_id = await _resumed(pool)
    await pool.execute(
        "UPDATE checkpoints SET value = '\"forged\"' WHERE run_id = $1 AND kind = 'signal'",
        run_id,
    )
    assert "the wait's payload is not the consumed signal's" in await _violations(pool)


async def test_signals_consumed_out_of_order_are_found(pool: Pool) -> None:
    run_id = await _resumed(pool)
    # The newer signal consumed in place of the older one (same payload, to isolate).
    await pool.execute(
        """UPDATE signals s SET consumed_by_task = o.consumed_by_task,
                  consumed_at = o.consumed_at, payload = o.payload
             FROM signals o
            WHERE s.run_id = $1 AND o.run_id = $1 AND s.id > o.id""",
        run_id,
    )
    await pool.execute(
        """UPDATE signals SET consumed_by_task = NULL, consumed_at = NULL
            WHERE id = (SELECT min(id) FROM signals WHERE run_id = $1)""",
        run_id,
    )
    assert "still buffered while a newer one was consumed" in await _violations(pool)


async def test_a_suspended_attempt_charged_is_found(pool: Pool) -> None:
    run_id = await _resumed(pool)
    await pool.execute("UPDATE tasks SET suspensions = 0 WHERE run_id = $1", run_id)
    assert "1 suspended attempts but 0 counted free" in await _violations(pool)
