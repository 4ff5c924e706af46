"""Schedules fired by the coordinator's passes: ticks only under the leader's current
term, once per (schedule, tick), each run recording its schedule and tick; the overlap
policies with runs that do not finish (no worker); delayed starts released on the
database clock. (The calendar: tests/kernel/test_schedules_kernel.py; real processes
killed, stopped and cut off: tests/fault/test_faults_schedules.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from coordinator_support import coordinator

from awp_db import leadership, runs, schedules, workflows
from awp_db.connect import Pool
from awp_db.leadership import Superseded, Term
from kit import poll_until, spec
from kit.invariants.schedules import check_schedule_ticks


async def _term(pool: Pool, holder: str) -> Term:
    attempt = await leadership.acquire(pool, holder, 60_000)
    assert attempt.epoch is not None
    return Term(holder, attempt.epoch, 60_000)


async def _schedule(pool: Pool, name: str = "every-second", **fields: Any) -> schedules.ScheduleRow:
    await workflows.create(pool, spec("wf"))
    values: dict[str, Any] = {
        "name": name,
        "workflow_name": "wf",
        "workflow_version": 0,
        "input": {"from": name},
        "cron": "",
        "interval_ms": 1000,
        "timezone": "UTC",
        "overlap": "allow_all",
        "catchup": "all",
        "catchup_window_ms": 60_000,
    }
    values.update(fields)
    async with pool.acquire() as conn:
        return await schedules.create(conn, schedules.ScheduleSpec(**values), "test")


async def _ticks(pool: Pool, name: str) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        """SELECT t.* FROM schedule_ticks t JOIN schedules s ON s.id = t.schedule_id
            WHERE s.name = $1 ORDER BY t.tick_at""",
        name,
    )
    return [dict(row) for row in rows]


async def test_ticks_fire_under_the_current_term_and_runs_record_them(
    pool: Pool, database_dsn: str
) -> None:
    row = await _schedule(pool)
    # Three seconds of ticks are due at once: catch-up "all" fires each, oldest first.
    await pool.execute(
        "UPDATE schedules"
        " SET next_tick_at = date_trunc('second', clock_timestamp()) - interval '2 s'"
    )
    term = await _term(pool, "leader")
    coord = coordinator(pool, database_dsn)
    report = await coord.run_pass(term)
    assert report.ticks_fired >= 3 and report.runs_started == report.ticks_fired
    ticks = await _ticks(pool, row.name)
    assert {t["leader_epoch"] for t in ticks} == {term.epoch}
    assert all(t["outcome"] == "started" and t["source"] == "schedule" for t in ticks)
    for tick in ticks:
        run = await runs.get(pool, tick["run_id"])
        assert (run.schedule_id, run.schedule_tick) == (row.id, tick["tick_at"])
        assert run.input == {"from": row.name}
    # A pass without a term leaves ticks to the leader.
    await pool.execute("UPDATE schedules SET next_tick_at = clock_timestamp() - interval '5 s'")
    assert (await coord.run_pass()).ticks_fired == 0
    await check_schedule_ticks(pool)


async def test_a_superseded_leader_creates_no_tick(pool: Pool, database_dsn: str) -> None:
    row = await _schedule(pool)
    old = await _term(pool, "old")
    # The old leader's lease lapses and another coordinator takes over.
    await pool.execute("UPDATE coordinator_leader SET expires_at = clock_timestamp()")
    new = await _term(pool, "new")
    await pool.execute("UPDATE schedules SET next_tick_at = clock_timestamp() - interval '3 s'")
    async with pool.acquire() as conn:
        with pytest.raises(Superseded):
            await schedules.fire_due(conn, old)
    assert await _ticks(pool, row.name) == []
    async with pool.acquire() as conn:
        fired = await schedules.fire_due(conn, new)
    assert fired.ticks >= 3
    assert {t["leader_epoch"] for t in await _ticks(pool, row.name)} == {new.epoch}
    await check_schedule_ticks(pool)


async def _fire_until(pool: Pool, term: Term, database_dsn: str, name: str, count: int) -> None:
    coord = coordinator(pool, database_dsn)

    async def enough() -> bool:
        await coord.run_pass(term)
        return len(await _ticks(pool, name)) >= count

    await poll_until(enough, f"{count} ticks of {name}", interval=0.2)


@pytest.mark.parametrize(
    ("overlap", "outcomes"),
    [
        ("skip", ["started", "skipped", "skipped"]),
        ("allow_all", ["started", "started", "started"]),
        ("buffer_one", ["started", "buffered", "skipped"]),
        ("cancel_previous", ["started", "started", "started"]),
    ],
)
async def test_overlap_policies_with_runs_that_do_not_finish(
    pool: Pool, database_dsn: str, overlap: str, outcomes: list[str]
) -> None:
    # No worker: every run stays running, so each tick after the first overlaps.
    row = await _schedule(pool, overlap=overlap, catchup="last")
    term = await _term(pool, "leader")
    await _fire_until(pool, term, database_dsn, row.name, 3)
    ticks = (await _ticks(pool, row.name))[:3]
    assert [t["outcome"] for t in ticks] == outcomes
    running = await pool.fetch(
        "SELECT id FROM runs WHERE schedule_id = $1 AND state = 'running' ORDER BY created_at",
        row.id,
    )
    if overlap == "cancel_previous":
        canceled = await pool.fetchval(
            "SELECT count(*) FROM runs WHERE schedule_id = $1 AND cancel_requested_at IS NOT NULL",
            row.id,
        )
        assert canceled >= 2  # each new tick asked the one before it to stop
    if overlap == "buffer_one":
        # The running run ends: the buffered tick starts its run, once.
        (first,) = [r["id"] for r in running]
        async with pool.acquire() as conn:
            await runs.request_cancel(conn, first, "test", "test")
        coord = coordinator(pool, database_dsn)

        async def buffered_started() -> bool:
            await coord.run_pass(term)
            return ticks[1]["tick_at"] in {
                t["tick_at"] for t in await _ticks(pool, row.name) if t["outcome"] == "started"
            }

        await poll_until(buffered_started, "the buffered tick started")
        started = await pool.fetch(
            "SELECT id FROM runs WHERE schedule_id = $1 AND schedule_tick = $2",
            row.id,
            ticks[1]["tick_at"],
        )
        assert len(started) == 1
    await check_schedule_ticks(pool)


async def test_a_delayed_run_exists_at_once_and_its_roots_wait_for_the_database_clock(
    pool: Pool, database_dsn: str
) -> None:
    stored, _ = await workflows.create(pool, spec("wf", 2, chain=True))
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, {}, None, "test", start=runs.Start(delay_ms=1500))
    run = await runs.get(pool, started.run_id)
    assert run.state == "running" and run.start_at is not None
    states = {t.key: t.state for t in await runs.tasks(pool, started.run_id)}
    assert states == {"t0": "pending", "t1": "pending"}
    coord = coordinator(pool, database_dsn)
    assert (await coord.run_pass()).starts_released == 0
    report = await coord.run_pass()
    assert report.next_due_in is not None and report.next_due_in <= 1.5

    async def released() -> bool:
        await coord.run_pass()
        return (await runs.tasks(pool, started.run_id))[0].state != "pending"

    await poll_until(released, "the delayed roots released")
    ready_at = await pool.fetchval(
        "SELECT ready_at FROM tasks WHERE run_id = $1 AND key = 't0'", started.run_id
    )
    assert ready_at >= run.start_at
    assert {t.key: t.state for t in await runs.tasks(pool, started.run_id)}["t1"] == "pending"


async def test_a_delayed_run_canceled_before_its_start_never_starts(
    pool: Pool, database_dsn: str
) -> None:
    stored, _ = await workflows.create(pool, spec("wf"))
    async with pool.acquire() as conn:
        started = await runs.start(conn, stored, {}, None, "test", start=runs.Start(delay_ms=500))
        await runs.request_cancel(conn, started.run_id, "not needed", "test")
    coord = coordinator(pool, database_dsn)
    await coord.run_pass()
    assert (await runs.get(pool, started.run_id)).state == "canceled"

    async def stopped_waiting() -> bool:
        await coord.run_pass()
        return not await pool.fetchval(
            "SELECT awaiting_start FROM runs WHERE id = $1", started.run_id
        )

    await poll_until(stopped_waiting, "the canceled run stops waiting")
    assert [t.state for t in await runs.tasks(pool, started.run_id)] == ["canceled"]


@pytest.mark.parametrize(
    ("catchup", "window_ms", "expect"),
    [("all", 60_000, 11), ("all", 3_000, 3), ("last", 1_000, 1), ("none", 60_000, 1)],
)
async def test_catch_up_after_ten_missed_seconds(
    pool: Pool, database_dsn: str, catchup: str, window_ms: int, expect: int
) -> None:
    # The schedule's next tick was ten seconds ago, as after a stack down for ten ticks.
    row = await _schedule(pool, catchup=catchup, catchup_window_ms=window_ms)
    await pool.execute(
        "UPDATE schedules"
        " SET next_tick_at = date_trunc('second', clock_timestamp()) - interval '10 s'"
    )
    term = await _term(pool, "leader")
    async with pool.acquire() as conn:
        fired = await schedules.fire_due(conn, term)
    ticks = [t["tick_at"] for t in await _ticks(pool, row.name)]
    # One more tick may have come due between setting the clock back and firing.
    assert expect <= fired.ticks == len(ticks) <= expect + 1
    assert ticks == sorted(ticks)
    after = await pool.fetchval("SELECT next_tick_at FROM schedules WHERE id = $1", row.id)
    assert after > ticks[-1]
    await check_schedule_ticks(pool)
