"""A worker's cycle (docs/design.md §17, "A Complete that carries the next Claim"): by
default each Complete also claims the slots its results free, so a chain's next task is
granted and leased in the transaction that accepted its predecessor's result; with
--claim-separately it waits for a Claim of its own. One transaction's events share their
run's revision, which shows where each start happened."""

from __future__ import annotations

from uuid import UUID

import pytest

from awp_db.connect import Pool
from kit import ServerHandle, spec, start_run
from worker.test_worker_integration import run_state, server, start_worker, worker_config

__all__ = ["server"]  # the fixture, used by name

HOPS = 4


async def hops_in_the_completing_transaction(pool: Pool, run_id: UUID) -> list[bool]:
    """For each task after the first: did it start in the transaction that accepted its
    predecessor's result?"""
    rows = await pool.fetch(
        """SELECT e.task_key, e.to_state, e.revision FROM state_events e
            WHERE e.run_id = $1 AND e.type = 'task.state'
              AND e.to_state IN ('running', 'succeeded')""",
        run_id,
    )
    at = {(row["task_key"], row["to_state"]): row["revision"] for row in rows}
    return [at[(f"t{i}", "running")] == at[(f"t{i - 1}", "succeeded")] for i in range(1, HOPS)]


@pytest.mark.parametrize("separately", [False, True])
async def test_a_chain_hops_inside_the_complete_unless_claiming_separately(
    server: ServerHandle, pool: Pool, separately: bool
) -> None:
    run_id = await start_run(pool, spec("hops", tasks=HOPS, chain=True))
    worker = start_worker(worker_config(server, concurrency=1, claim_separately=separately))
    assert await run_state(pool, run_id, "succeeded", "failed") == "succeeded"
    await worker.stop()
    hops = await hops_in_the_completing_transaction(pool, run_id)
    assert hops == [not separately] * (HOPS - 1), hops
