"""The checkpoint rule of the invariant checker ("no checkpoint stored by a stale
attempt", kit/invariants/checkpoints.py) has teeth: each corruption of a stored history
is named (storage layer only: fast, not `fault`)."""

from __future__ import annotations

import pytest

from awp_db.connect import Pool
from kit import spec, start_run
from kit.db import register
from kit.invariants import InvariantViolation, check_committed


async def _finished_attempt(pool: Pool) -> int:
    """A run whose one task succeeded; its dispatch."""
    await start_run(pool, spec(tasks=1))
    worker = await register(pool, name="checker")
    issued = await worker.dispatch_and_claim()
    assert all(v == "ACCEPTED" for v in await worker.complete_all(issued))
    return issued[0].dispatch_id


async def _memo(
    pool: Pool,
    dispatch_id: int,
    *,
    at: str = "a.started_at",
    attempt: str = "a.attempt",
    token: str = "a.fencing_token",
) -> None:
    await pool.execute(
        f"""INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value,
                                     value_bytes, dispatch_id, attempt, fencing_token,
                                     recorded_at)
            SELECT a.task_id, a.run_id, 'step', 'call', 0, '"x"', 3, a.dispatch_id,
                   {attempt}, {token}, {at}
              FROM attempts a WHERE a.dispatch_id = $1""",
        dispatch_id,
    )


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_memo_stored_under_its_live_lease_passes(pool: Pool) -> None:
    await _memo(pool, await _finished_attempt(pool))
    await check_committed(pool)


async def test_a_memo_stored_after_its_attempt_ended_is_found(pool: Pool) -> None:
    dispatch_id = await _finished_attempt(pool)
    await _memo(pool, dispatch_id, at="a.finished_at + interval '1 second'")
    assert "stored after its attempt ended (a stale attempt's memo)" in await _violations(pool)


async def test_a_memo_naming_another_lease_is_found(pool: Pool) -> None:
    dispatch_id = await _finished_attempt(pool)
    await _memo(pool, dispatch_id, token="a.fencing_token - 1")
    assert "but its dispatch" in await _violations(pool)


async def test_a_memo_stored_after_a_later_attempt_started_is_found(pool: Pool) -> None:
    dispatch_id = await _finished_attempt(pool)
    # As if attempt 2 had started before attempt 1's memo was stored.
    later = await pool.fetchval(
        """INSERT INTO dispatches (run_id, task_id, executor_kind, state, finished_at)
           SELECT run_id, task_id, executor_kind, 'expired', finished_at
             FROM dispatches WHERE id = $1
           RETURNING id""",
        dispatch_id,
    )
    await pool.execute(
        """INSERT INTO attempts (task_id, run_id, attempt, dispatch_id, worker_id,
                                 fencing_token, state, started_at, deadline, finished_at)
           SELECT task_id, run_id, 2, $2, worker_id, fencing_token + 1, 'interrupted',
                  started_at + interval '1 millisecond', deadline, finished_at
             FROM attempts WHERE dispatch_id = $1""",
        dispatch_id,
        later,
    )
    await _memo(pool, dispatch_id, at="a.started_at + interval '2 milliseconds'")
    assert "after a later attempt of its task had started" in await _violations(pool)


async def test_a_step_memo_of_no_attempt_is_found(pool: Pool) -> None:
    dispatch_id = await _finished_attempt(pool)
    await pool.execute(
        """INSERT INTO checkpoints (task_id, run_id, kind, name, occurrence, value, value_bytes)
           SELECT task_id, run_id, 'sleep', '', 0, '{}', 2 FROM attempts WHERE dispatch_id = $1""",
        dispatch_id,
    )
    await check_committed(pool)  # a wait's outcome may be stored by a timer
    await pool.execute("ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_check1")
    await pool.execute("UPDATE checkpoints SET kind = 'step', name = 'orphan'")
    assert "1 step memos stored by no attempt" in await _violations(pool)
