"""The invariants of schedules (docs/schedules.md), checked in SQL over one snapshot.

schedule_problems, over the whole database (part of every check_committed and
check_invariants; check_schedule_ticks runs it alone):
1. Every started tick has exactly one run, the one it names, and that run records the
   tick's schedule and instant; every run a schedule started has its tick.
2. No tick was created under a stale epoch: in creation order, the leader epochs of
   the coordinator's ticks never go down, and each run's run.created event names the
   epoch of the tick that started it.

Rule 1 reads runs: a scenario that prunes runs (retention) keeps their ticks (the
exactly-once key outlives the run on purpose), so it would see those ticks as runless.

check_fired_exactly_once, for one schedule and a window: every tick of the cadence in
the window started exactly one run (checked from the runs' schedule and tick), and no
run names a tick outside the cadence.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from awp_kernel.schedules import Cadence
from kit.invariants.common import Db, raise_if_any, snapshot


async def schedule_problems(conn: Db) -> list[str]:
    """Rules 1 and 2 over the whole database (committed.py runs them in every check)."""
    problems: list[str] = []
    for row in await conn.fetch(
        """SELECT t.schedule_id, t.tick_at, t.run_id,
                  (SELECT count(*) FROM runs r
                    WHERE r.schedule_id = t.schedule_id
                      AND r.schedule_tick = t.tick_at) AS runs,
                  (SELECT r.id FROM runs r
                    WHERE r.schedule_id = t.schedule_id AND r.schedule_tick = t.tick_at
                    LIMIT 1) AS found
             FROM schedule_ticks t WHERE t.outcome = 'started'"""
    ):
        if row["runs"] != 1 or row["found"] != row["run_id"]:
            problems.append(
                f"tick {row['tick_at']} of schedule {row['schedule_id']}: started "
                f"{row['runs']} runs (names run {row['run_id']})"
            )
    for row in await conn.fetch(
        """SELECT r.id, r.schedule_id, r.schedule_tick FROM runs r
            WHERE r.schedule_id IN (SELECT id FROM schedules)
              AND NOT EXISTS (SELECT 1 FROM schedule_ticks t
                               WHERE t.schedule_id = r.schedule_id
                                 AND t.tick_at = r.schedule_tick AND t.run_id = r.id)"""
    ):
        problems.append(
            f"run {row['id']} names tick {row['schedule_tick']} of schedule "
            f"{row['schedule_id']}, which does not name it"
        )
    for row in await conn.fetch(
        """SELECT schedule_id, tick_at, leader_epoch, newest_before FROM (
             SELECT schedule_id, tick_at, leader_epoch,
                    max(leader_epoch) OVER (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING
                                            AND 1 PRECEDING) AS newest_before
               FROM schedule_ticks WHERE source = 'schedule') ticks
            WHERE leader_epoch < newest_before"""
    ):
        problems.append(
            f"tick {row['tick_at']} of schedule {row['schedule_id']} was created under "
            f"epoch {row['leader_epoch']} after a tick of epoch {row['newest_before']}: "
            "a stale leader's"
        )
    for row in await conn.fetch(
        """SELECT t.tick_at, t.leader_epoch, e.payload->>'leader_epoch' AS logged
             FROM schedule_ticks t
             JOIN runs r ON r.id = t.run_id
             JOIN state_events e ON e.run_id = r.id AND e.type = 'run.created'
            WHERE t.source = 'schedule'
              AND (e.payload->>'leader_epoch') IS DISTINCT FROM t.leader_epoch::text"""
    ):
        problems.append(
            f"tick {row['tick_at']}: its tick row says epoch {row['leader_epoch']}, its "
            f"run's creation {row['logged']}"
        )
    return problems


async def check_schedule_ticks(db: Db) -> None:
    """Rules 1 and 2 alone, over one snapshot."""
    async with snapshot(db) as conn:
        problems = await schedule_problems(conn)
    raise_if_any(problems)


async def check_fired_exactly_once(
    db: Db, schedule_id: UUID, cadence: Cadence, start: datetime, end: datetime
) -> int:
    """Raises InvariantViolation unless each tick of cadence in [start, end] started
    exactly one run and every run of the schedule in that window is at a tick; returns
    how many ticks the window holds."""
    expected = cadence.between(start, end, 1_000_000)
    async with snapshot(db) as conn:
        rows = await conn.fetch(
            """SELECT schedule_tick, count(*) AS n FROM runs
                WHERE schedule_id = $1 AND schedule_tick BETWEEN $2 AND $3
                GROUP BY schedule_tick""",
            schedule_id,
            start,
            end,
        )
    fired = {row["schedule_tick"]: row["n"] for row in rows}
    problems = [f"tick {tick} never fired" for tick in expected if tick not in fired]
    problems += [f"tick {tick} fired {n} times" for tick, n in fired.items() if n != 1]
    problems += [f"run at {tick}, not a tick" for tick in fired if tick not in set(expected)]
    raise_if_any(problems)
    return len(expected)
