"""The schedule invariants have teeth (kit.invariants.schedules): a clean history passes,
and each corruption -- a tick fired twice, a tick that never fired, a run its tick does
not name, a tick created under a stale epoch -- is named. Ticks are fired through the
storage layer under real leader terms (no processes: fast, not `fault`)."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from awp_db import leadership, schedules, workflows
from awp_db.connect import Pool
from awp_db.leadership import Term
from awp_kernel.schedules import Cadence
from kit import poll_until, spec
from kit.invariants import InvariantViolation, check_committed
from kit.invariants.schedules import check_fired_exactly_once, check_schedule_ticks

SECOND = Cadence(None, 1000, "UTC")


async def _term(pool: Pool, holder: str) -> Term:
    await pool.execute("UPDATE coordinator_leader SET expires_at = clock_timestamp()")
    attempt = await leadership.acquire(pool, holder, 60_000)
    assert attempt.epoch is not None
    return Term(holder, attempt.epoch, 60_000)


async def _fired(pool: Pool) -> UUID:
    """A 1-second schedule whose last five ticks fired under one term, then the next
    under the following term."""
    await workflows.create(pool, spec("wf"))
    async with pool.acquire() as conn:
        row = await schedules.create(
            conn,
            schedules.ScheduleSpec("s", "wf", 0, {}, "", 1000, "UTC", "allow_all", "all", 60_000),
            "test",
        )
    await pool.execute(
        "UPDATE schedules SET next_tick_at = date_trunc('second', clock_timestamp())"
        " - interval '4 s'"
    )
    for holder in ("first", "second"):
        term = await _term(pool, holder)

        async def fires(term: Term = term) -> bool:
            async with pool.acquire() as conn:
                return (await schedules.fire_due(conn, term)).ticks > 0

        # The second term waits for the next tick (at most a second).
        await poll_until(fires, f"a tick under {holder}")
    return row.id


async def _window(pool: Pool, schedule_id: UUID) -> tuple[object, object]:
    row = await pool.fetchrow(
        "SELECT min(schedule_tick) AS a, max(schedule_tick) AS b FROM runs WHERE schedule_id = $1",
        schedule_id,
    )
    assert row is not None
    return row["a"], row["b"]


async def _violation(check: object) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check  # type: ignore[misc]
    return str(caught.value)


async def test_a_clean_history_passes(pool: Pool) -> None:
    schedule_id = await _fired(pool)
    start, end = await _window(pool, schedule_id)
    await check_schedule_ticks(pool)
    assert await check_fired_exactly_once(pool, schedule_id, SECOND, start, end) >= 5  # type: ignore[arg-type]


async def test_a_tick_fired_twice_and_a_tick_never_fired_are_named(pool: Pool) -> None:
    schedule_id = await _fired(pool)
    start, end = await _window(pool, schedule_id)
    # Corrupt: the run of the newest tick is copied (a duplicate fire), the oldest tick's
    # run is moved off the cadence (a gap, and a run at no tick).
    await pool.execute("DROP INDEX runs_schedule_tick")
    await pool.execute(
        """INSERT INTO runs (workflow_id, input, concurrency, started_by, schedule_id,
                               schedule_tick)
           SELECT workflow_id, input, concurrency, started_by, schedule_id, schedule_tick
             FROM runs WHERE schedule_id = $1 AND schedule_tick = $2""",
        schedule_id,
        end,
    )
    await pool.execute(
        "UPDATE runs SET schedule_tick = schedule_tick + interval '1 ms'"
        " WHERE schedule_id = $1 AND schedule_tick = $2",
        schedule_id,
        start,
    )
    found = await _violation(check_fired_exactly_once(pool, schedule_id, SECOND, start, end))  # type: ignore[arg-type]
    assert f"tick {end} fired 2 times" in found
    assert f"tick {start} never fired" in found
    assert "not a tick" in found
    found = await _violation(check_schedule_ticks(pool))
    assert "started 2 runs" in found and "which does not name it" in found


async def test_a_tick_created_under_a_stale_epoch_is_named(pool: Pool) -> None:
    schedule_id = await _fired(pool)
    _, end = await _window(pool, schedule_id)
    old = await pool.fetchval(
        "SELECT min(leader_epoch) FROM schedule_ticks WHERE schedule_id = $1", schedule_id
    )
    # Corrupt: a tick written after the takeover, under the superseded epoch.
    await pool.execute(
        """INSERT INTO schedule_ticks (schedule_id, tick_at, source, leader_epoch, outcome)
           VALUES ($1, $2, 'schedule', $3, 'skipped')""",
        schedule_id,
        end + timedelta(seconds=1),
        old,
    )
    found = await _violation(check_schedule_ticks(pool))
    assert f"under epoch {old} after a tick of epoch {old + 1}" in found
    # The one checker every scenario runs says so too.
    assert f"under epoch {old} after" in await _violation(check_committed(pool))
