"""Retention: finished runs past an age are deleted with everything that belongs to them
(DESIGN.md §7, docs/retention.md).

A batch is one short transaction. It locks up to a batch of the oldest runs that
finished before the cutoff, skipping any another transaction holds (locks.expired_runs:
a live transaction is never waited for), then deletes their attempts, dispatches,
events and tasks, the schedule ticks that started them (and ticks skipped before the
cutoff), and the runs. A schedule fires on from its next_tick_at, so a forgotten tick
never fires again by itself; only a backfill over a range older than the retention age
could start such a tick again (docs/schedules.md). Buffered ticks are never pruned.
Only finished runs qualify, so nothing of a live run is ever touched; a run and all its
rows go in one transaction, so a reader sees a run whole or not at all. Given a leader's
term, the batch writes only while that term holds.

`prune` runs batches back to back but rests after each as long as it took, so that
pruning a large backlog takes at most half of one connection's time, and of the row
locks it needs, from the live work sharing the database.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Final
from uuid import UUID

from awp_db import locks
from awp_db.connect import Conn, Pool
from awp_db.leadership import Term, transaction
from awp_db.queries import queries

Q = queries("retention")

# Runs one transaction deletes at most, unless told otherwise: with their tasks,
# attempts, dispatches and events some thousands of rows, tens of milliseconds.
BATCH_RUNS: Final = 200
# After each full batch, pruning rests this many times as long as the batch took.
REST_FACTOR: Final = 1.0
MIN_REST_S: Final = 0.01
# Ages beyond this are as good as forever (nothing stored is that old), and keep the
# cutoff within PostgreSQL's timestamps.
MAX_AGE_S: Final = 1000 * 365 * 86400.0

# A position in retention's order: (finished_at, id) of the last run seen.
Position = tuple[datetime, UUID]


@dataclass(frozen=True, slots=True)
class Pruned:
    """Rows deleted (or, in a dry run, that would be), by table."""

    runs: int = 0
    tasks: int = 0
    attempts: int = 0
    dispatches: int = 0
    state_events: int = 0
    schedule_ticks: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def by_table(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def rows(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class Survey:
    """A dry run's page: what its runs hold, and where the next page starts (None: this
    page was empty)."""

    would: Pruned
    last: Position | None


async def cutoff(conn: Conn | Pool, older_than_s: float) -> datetime:
    """Runs that finished before the returned instant (database clock) are older than
    older_than_s."""
    age_ms = round(min(older_than_s, MAX_AGE_S) * 1000)
    instant: datetime = await conn.fetchval(Q["cutoff"], age_ms)
    return instant


async def prune_batch(
    conn: Conn, before: datetime, limit: int, *, term: Term | None = None
) -> Pruned:
    """Deletes up to `limit` runs that finished before `before`, oldest first, with all
    their rows; runs another transaction holds are left for a later batch."""
    async with transaction(conn, term):
        doomed = await locks.expired_runs(conn, before, limit)
        if not doomed:
            return Pruned()
        # Children first: stream chunks and attempts reference dispatches, dispatches tasks.
        await conn.execute(Q["delete_stream_chunks"], doomed)
        attempts = await conn.fetchval(Q["delete_attempts"], doomed)
        dispatches = await conn.fetchval(Q["delete_dispatches"], doomed)
        events = await conn.fetchval(Q["delete_state_events"], doomed)
        tasks = await conn.fetchval(Q["delete_tasks"], doomed)
        ticks = await conn.fetchval(Q["delete_schedule_ticks"], doomed, before, limit)
        runs = await conn.fetchval(Q["delete_runs"], doomed)
    return Pruned(runs, tasks, attempts, dispatches, events, ticks)


async def prune(
    conn: Conn,
    before: datetime,
    runs: int,
    *,
    batch: int = BATCH_RUNS,
    term: Term | None = None,
) -> Pruned:
    """Deletes up to `runs` runs that finished before `before`, `batch` per transaction,
    resting after each full batch (module docstring). Stops early once a batch finds
    fewer than it asked for: what is left is held by others, or not there."""
    total = Pruned()
    while total.runs < runs:
        asked = min(batch, runs - total.runs)
        started = time.monotonic()
        done = await prune_batch(conn, before, asked, term=term)
        total += done
        if done.runs < asked or total.runs >= runs:
            break
        await asyncio.sleep(rest_after(time.monotonic() - started))
    return total


def rest_after(batch_s: float) -> float:
    """How long pruning rests after a full batch that took batch_s."""
    return max(REST_FACTOR * batch_s, MIN_REST_S)


async def backlog(conn: Conn | Pool, before: datetime, after: Position | None = None) -> int:
    """Runs finished before `before` still stored (only those after `after`, if given)."""
    since, run_id = after if after is not None else (None, None)
    count: int = await conn.fetchval(Q["backlog"], before, since, run_id)
    return count


async def survey(conn: Conn | Pool, before: datetime, after: Position | None, limit: int) -> Survey:
    """A dry run's page: the next `limit` runs finished before `before` after `after`,
    counted with their rows, deleting nothing."""
    since, run_id = after if after is not None else (None, None)
    row = await conn.fetchrow(Q["survey"], before, since, run_id, limit)
    assert row is not None
    would = Pruned(*(row[f.name] for f in fields(Pruned)))
    last = None if row["last_id"] is None else (row["last_finished_at"], row["last_id"])
    return Survey(would, last)
