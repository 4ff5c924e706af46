"""A run's live tasks are found through tasks_live (migration 0024), not by walking every
task the run ever had: run completion asks this after every settlement."""

from __future__ import annotations

from awp_db.connect import Pool
from awp_protocol.states import LIVE_TASK_STATES
from kit import spec, start_run


async def test_a_query_for_every_live_state_of_a_run_reads_the_live_tasks_index(
    pool: Pool,
) -> None:
    run_id = await start_run(pool, spec("live-index", 20))
    async with pool.acquire() as conn, conn.transaction():
        # Among the indexes that could serve it: a table this small would be read whole.
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(
            row[0]
            for row in await conn.fetch(
                "EXPLAIN SELECT 1 FROM tasks WHERE run_id = $1 AND state = ANY($2::text[])",
                run_id,
                sorted(LIVE_TASK_STATES),
            )
        )
    assert "tasks_live" in plan, plan
