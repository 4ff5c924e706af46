"""Retention in the coordinator: --retention 0 keeps everything; an age keeps what is
younger and deletes what is older; the leader drains a backlog in paced batches beside
its passes, counting what it deleted (by table) and what is left. (The batches
themselves: tests/db/test_retention_batches.py; under live load with real processes:
tests/fault/test_faults_retention.py.)"""

from __future__ import annotations

import asyncio

import asyncpg
from coordinator_support import coordinator

from awp_coordinator.config import parse
from awp_db.connect import Pool
from kit import backlog, poll_until, spec, start_run
from kit.db import drive_to_end, register

DAY_S = 86400.0


def deleted(coord: object, table: str) -> float:
    value = coord.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "awp_coordinator_retention_deleted_rows_total", {"table": table}
    )
    return value or 0.0


async def test_retention_zero_keeps_everything(pool: Pool) -> None:
    await backlog.seed(pool, 20, finished_ago_s=10 * 365 * DAY_S)
    coord = coordinator(pool, retention_s=0.0)
    assert (await coord.prune_once()).rows == 0
    assert await coord.retention_backlog() == 0
    assert len(await backlog.run_ids(pool)) == 20
    # A pass does nothing to finished runs either.
    await coord.run_pass()
    assert len(await backlog.run_ids(pool)) == 20
    assert parse(["--database-url", "x", "--retention", "0"]).retention_s == 0


async def test_an_age_deletes_what_is_older_and_keeps_what_is_younger(pool: Pool) -> None:
    older = await backlog.seed(pool, 5, tasks=2, finished_ago_s=DAY_S + 60)
    doomed = await backlog.run_ids(pool)
    await backlog.seed(pool, 4, tasks=2, finished_ago_s=DAY_S - 60)
    worker = await register(pool)
    recent = await start_run(pool, spec("recent", 2))
    assert await drive_to_end(pool, recent, worker) == "succeeded"

    coord = coordinator(pool, retention_s=DAY_S, retention_batch=100)
    assert await coord.retention_backlog() == 5
    pruned = await coord.prune_once()
    assert pruned.runs == 5
    assert pruned.rows == older.rows
    kept = await backlog.run_ids(pool)
    assert len(kept) == 4 and not kept & doomed
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = $1", recent) == 1
    for table, rows in pruned.by_table().items():
        assert deleted(coord, table) == rows
    assert await coord.retention_backlog() == 0


async def test_the_leader_drains_a_backlog_and_reports_it(pool: Pool, database_dsn: str) -> None:
    made = await backlog.seed(pool, 45, tasks=1, finished_ago_s=2 * DAY_S)
    oldest = await pool.fetchval("SELECT id FROM runs ORDER BY finished_at LIMIT 1")
    # A batch of 10: the drain takes five batches, resting between them.
    coord = coordinator(
        pool, database_dsn, retention_s=DAY_S, retention_batch=10, scan_interval_s=0.2
    )
    registry = coord.metrics.registry

    def gauge() -> float | None:
        return registry.get_sample_value("awp_coordinator_retention_backlog_runs")

    # Another transaction holds the oldest run: the leader skips it, and knows it is left.
    holder = await asyncpg.connect(database_dsn)
    held = holder.transaction()
    await held.start()
    await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", oldest)
    stop = asyncio.Event()
    loop = asyncio.create_task(coord.run(stop))
    try:

        async def all_but_the_held_one() -> bool:
            return await backlog.run_ids(pool) == {oldest} and gauge() == 1

        await poll_until(all_but_the_held_one, "the leader to prune what it can", within=30)
        await held.rollback()

        async def drained() -> bool:
            return not await backlog.run_ids(pool) and gauge() == 0

        await poll_until(drained, "the leader to prune the held run once free", within=10)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
        await holder.close()
    tables = ("runs", "tasks", "attempts", "dispatches", "state_events")
    assert sum(deleted(coord, table) for table in tables) == made.rows
    assert deleted(coord, "runs") == 45
