"""Retention over a real PostgreSQL (awp_db.retention): a batch deletes finished runs past
the cutoff with every row they own and nothing else, oldest first and bounded; the
boundary is strict; a run another transaction holds is skipped without a wait; a dry
run counts page by page and deletes nothing; a superseded leader deletes nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

import asyncpg
import pytest

from awp_db import leadership, retention, schedules, workflows
from awp_db.connect import Pool
from awp_db.leadership import Superseded, Term
from kit import backlog, spec, start_run
from kit.db import drive_to_end, register

TABLES = ("runs", "tasks", "attempts", "dispatches", "state_events", "schedule_ticks")
DAY_S = 86400.0


async def rows_of(pool: Pool, run_ids: set[UUID]) -> dict[str, int]:
    """Rows each table holds for these runs."""
    ids = list(run_ids)
    counts = {"runs": await pool.fetchval("SELECT count(*) FROM runs WHERE id = ANY($1)", ids)}
    for table in TABLES[1:]:
        counts[table] = await pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE run_id = ANY($1)", ids
        )
    return counts


async def finished_at(pool: Pool, run_ids: list[UUID]) -> list[datetime]:
    rows = await pool.fetch(
        "SELECT finished_at FROM runs WHERE id = ANY($1) ORDER BY finished_at", run_ids
    )
    return [row["finished_at"] for row in rows]


async def test_a_batch_deletes_expired_finished_runs_whole_and_nothing_else(pool: Pool) -> None:
    old = retention.Pruned()
    for state in ("succeeded", "failed", "canceled"):
        made = await backlog.seed(pool, 10, tasks=2, state=state)
        old += retention.Pruned(runs=made.runs)
    expired = await backlog.run_ids(pool)
    # Live work, and a run that finished just now, share the tables.
    worker = await register(pool)
    live = await start_run(pool, spec("live", 3, chain=True))
    recent = await start_run(pool, spec("recent", 2))
    assert await drive_to_end(pool, recent, worker) == "succeeded"
    kept = {live, recent}
    kept_before = await rows_of(pool, kept)
    assert kept_before["state_events"] > 0 and kept_before["dispatches"] > 0

    async with pool.acquire() as conn:
        pruned = await retention.prune_batch(conn, await retention.cutoff(conn, DAY_S), 1000)

    per_run = {"runs": 1, "tasks": 2, "attempts": 2, "dispatches": 2, "state_events": 10}
    per_run["schedule_ticks"] = 0
    assert pruned.by_table() == {table: 30 * n for table, n in per_run.items()}
    assert await rows_of(pool, expired) == dict.fromkeys(TABLES, 0)
    assert await rows_of(pool, kept) == kept_before


async def test_batches_are_bounded_and_oldest_first(pool: Pool) -> None:
    await backlog.seed(pool, 25, tasks=1)
    all_finished = await finished_at(pool, list(await backlog.run_ids(pool)))
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, DAY_S)
        assert await retention.backlog(conn, before) == 25
        first = await retention.prune_batch(conn, before, 10)
        assert first.runs == 10
        assert await finished_at(pool, list(await backlog.run_ids(pool))) == all_finished[10:]
        assert await retention.backlog(conn, before) == 15
        # prune: batches of 4 up to 12 runs, then a short batch ends it.
        assert (await retention.prune(conn, before, 12, batch=4)).runs == 12
        assert (await retention.prune(conn, before, 100, batch=4)).runs == 3
        assert await retention.backlog(conn, before) == 0


async def test_the_boundary_is_strict_finished_exactly_at_the_age_is_kept(pool: Pool) -> None:
    await backlog.seed(pool, 3, tasks=1)
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, 7 * DAY_S)
        tick = timedelta(microseconds=1)  # timestamptz's resolution
        # Exactly 7 days old at the cutoff's instant; a microsecond older; one younger.
        at, older, younger = sorted(await backlog.run_ids(pool))
        for run_id, moment in ((at, before), (older, before - tick), (younger, before + tick)):
            await conn.execute("UPDATE runs SET finished_at = $2 WHERE id = $1", run_id, moment)
        pruned = await retention.prune_batch(conn, before, 100)
    assert pruned.runs == 1
    assert await backlog.run_ids(pool) == {at, younger}


async def test_a_run_another_transaction_holds_is_skipped_not_waited_for(
    pool: Pool, database_dsn: str
) -> None:
    await backlog.seed(pool, 3, tasks=1)
    oldest = (await pool.fetchrow("SELECT id FROM runs ORDER BY finished_at LIMIT 1"))["id"]  # type: ignore[index]
    holder = await asyncpg.connect(database_dsn)
    try:
        held = holder.transaction()
        await held.start()
        await holder.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", oldest)
        async with pool.acquire() as conn, conn.transaction():
            # Any wait at all would end in LockNotAvailableError.
            await conn.execute("SET LOCAL lock_timeout = '1ms'")
            before = await retention.cutoff(conn, DAY_S)
            pruned = await retention.prune_batch(conn, before, 100)
        assert pruned.runs == 2
        assert await backlog.run_ids(pool) == {oldest}
        await held.rollback()
    finally:
        await holder.close()
    async with pool.acquire() as conn:
        assert (await retention.prune_batch(conn, before, 100)).runs == 1


async def test_a_dry_run_pages_through_everything_and_deletes_nothing(pool: Pool) -> None:
    made = await backlog.seed(pool, 25, tasks=2)
    expired = await backlog.run_ids(pool)
    stored = await rows_of(pool, expired)
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, DAY_S)
        counted = retention.Pruned()
        after: retention.Position | None = None
        pages = []
        while True:
            page = await retention.survey(conn, before, after, 10)
            if page.last is None:
                break
            pages.append(page.would.runs)
            counted += page.would
            after = page.last
            assert await retention.backlog(conn, before, after) == 25 - counted.runs
    assert pages == [10, 10, 5]
    assert counted.by_table() == stored
    assert counted.rows == made.rows
    assert await rows_of(pool, expired) == stored


async def test_a_superseded_leader_deletes_nothing(pool: Pool) -> None:
    await backlog.seed(pool, 5, tasks=1)
    first = await leadership.acquire(pool, "a", 60_000)
    assert first.epoch is not None
    stale = Term("a", first.epoch, 60_000)
    await pool.execute("UPDATE coordinator_leader SET expires_at = clock_timestamp()")
    assert (await leadership.acquire(pool, "b", 60_000)).epoch is not None
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, DAY_S)
        with pytest.raises(Superseded):
            await retention.prune_batch(conn, before, 100, term=stale)
    assert len(await backlog.run_ids(pool)) == 5


async def test_an_age_beyond_any_timestamp_keeps_everything(pool: Pool) -> None:
    await backlog.seed(pool, 2, tasks=1)
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, 10**7 * 365 * DAY_S)
        assert (await retention.prune_batch(conn, before, 100)).runs == 0


async def test_ticks_go_with_their_runs_and_skipped_ones_with_age_buffered_ones_stay(
    pool: Pool,
) -> None:
    await backlog.seed(pool, 2, tasks=1)
    old_run = next(iter(await backlog.run_ids(pool)))
    await workflows.create(pool, spec("scheduled"))
    async with pool.acquire() as conn:
        schedule = await schedules.create(
            conn,
            schedules.ScheduleSpec(
                name="hourly",
                workflow_name="scheduled",
                workflow_version=0,
                input={},
                cron="",
                interval_ms=3_600_000,
                timezone="UTC",
                overlap="skip",
                catchup="all",
                catchup_window_ms=60_000,
            ),
            "test",
        )
    # (tick's age in days, outcome, run): the old run's tick, an old skipped and an old
    # buffered tick, and a recent skipped one.
    ticks = [
        (40, "started", old_run),
        (41, "skipped", None),
        (42, "buffered", None),
        (0.01, "skipped", None),
    ]
    for days, outcome, run_id in ticks:
        tick = await pool.fetchval("SELECT now() - $1 * interval '1 day'", days)
        await pool.execute(
            "INSERT INTO schedule_ticks (schedule_id, tick_at, source, outcome, run_id)"
            " VALUES ($1, $2, 'trigger', $3, $4)",
            schedule.id,
            tick,
            outcome,
            run_id,
        )
        if run_id is not None:
            await pool.execute(
                "UPDATE runs SET schedule_id = $1, schedule_tick = $2 WHERE id = $3",
                schedule.id,
                tick,
                run_id,
            )
    async with pool.acquire() as conn:
        before = await retention.cutoff(conn, DAY_S)
        surveyed = await retention.survey(conn, before, None, 10)
        assert surveyed.would.schedule_ticks == 1  # the run's; skipped ticks are not a run's
        pruned = await retention.prune_batch(conn, before, 1000)
    assert (pruned.runs, pruned.schedule_ticks) == (2, 2)
    left = await pool.fetch("SELECT outcome, tick_at > $1 AS recent FROM schedule_ticks", before)
    assert sorted((r["outcome"], r["recent"]) for r in left) == [
        ("buffered", False),
        ("skipped", True),
    ]
