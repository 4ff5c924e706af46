"""The stream rules of the invariant checker (kit.stream_invariants) have teeth: each
corruption of a stored stream is named (storage layer only: fast, not `fault`)."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_db.connect import Pool
from kit import spec, start_run
from kit.db import register
from kit.invariants import InvariantViolation, check_committed


async def _finished_attempt(pool: Pool) -> tuple[UUID, int]:
    """A run whose one task succeeded; its dispatch."""
    run_id = await start_run(pool, spec(tasks=1))
    worker = await register(pool, name="checker")
    issued = await worker.dispatch_and_claim()
    assert all(v == "ACCEPTED" for v in await worker.complete_all(issued))
    return run_id, issued[0].dispatch_id


async def _chunk(
    pool: Pool, dispatch_id: int, offset: int, position: int, at: str = "d.leased_at"
) -> None:
    await pool.execute(
        f"""INSERT INTO stream_chunks (dispatch_id, chunk_offset, run_id, task_id, attempt,
                                       position, data, is_json, total_bytes, created_at)
            SELECT d.id, $2::bigint, d.run_id, d.task_id, a.attempt, $3, 'x', false,
                   $2::bigint + 1, {at}
              FROM dispatches d JOIN attempts a ON a.dispatch_id = d.id WHERE d.id = $1""",
        dispatch_id,
        offset,
        position,
    )


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_clean_stream_passes(pool: Pool) -> None:
    _, dispatch_id = await _finished_attempt(pool)
    for offset in range(3):
        await _chunk(pool, dispatch_id, offset, offset)
    await check_committed(pool)


async def test_a_chunk_stored_after_its_lease_ended_is_found(pool: Pool) -> None:
    _, dispatch_id = await _finished_attempt(pool)
    await _chunk(pool, dispatch_id, 0, 0, at="d.finished_at + interval '1 second'")
    assert "stored after its lease was settled" in await _violations(pool)


async def test_a_chunk_stored_after_a_later_attempt_started_is_found(pool: Pool) -> None:
    _, dispatch_id = await _finished_attempt(pool)
    await _chunk(pool, dispatch_id, 0, 0)
    # As if attempt 2 had started before attempt 1's chunk was stored.
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
                  started_at - interval '1 second', deadline, finished_at
             FROM attempts WHERE dispatch_id = $1""",
        dispatch_id,
        later,
    )
    assert "after a later attempt of its task had started" in await _violations(pool)


async def test_a_gap_in_offsets_and_positions_is_found(pool: Pool) -> None:
    _, dispatch_id = await _finished_attempt(pool)
    await _chunk(pool, dispatch_id, 0, 0)
    await _chunk(pool, dispatch_id, 2, 2)
    found = await _violations(pool)
    assert f"dispatch {dispatch_id}: 2 chunks at offsets 0..2, not contiguous" in found
    assert "chunks at positions 0..2, not contiguous" in found


async def test_positions_out_of_attempt_order_are_found(pool: Pool) -> None:
    _, dispatch_id = await _finished_attempt(pool)
    await _chunk(pool, dispatch_id, 0, 1)
    await _chunk(pool, dispatch_id, 1, 0)
    assert "positions out of (attempt, offset) order" in await _violations(pool)
