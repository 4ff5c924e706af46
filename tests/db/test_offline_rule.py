"""Offline detection never blames a worker for the platform's outage (DESIGN.md §7): a
session's silence counts from the later of its last heartbeat and the start of the
current unbroken stretch during which some awp-server was live (heartbeat_silence_from,
migration 0005), and the servers record those stretches (workers.record_liveness).

Times are minutes to hours away from now, so the clock moving during a test never
changes an answer.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pytest

from awp_db import coordination, locks, workers
from awp_db.workers import OfflineRule

# 3 intervals of 5 s, at least a minute: the coordinator's rule with a one-minute floor.
RULE = OfflineRule(intervals=3, floor_ms=60_000)
HOUR = 3600.0


@pytest.fixture
async def tx(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    transaction = conn.transaction()
    await transaction.start()
    try:
        yield conn
    finally:
        await transaction.rollback()


async def _worker(conn: asyncpg.Connection, silent_for_s: float) -> uuid.UUID:
    worker_id: uuid.UUID = await conn.fetchval(
        """INSERT INTO workers (name, protocol_version, executor_kinds, max_concurrency,
                                session_token_hash, last_heartbeat_at)
           VALUES ('w', 1, '{mock}', 1, $1, now() - $2 * interval '1 second')
           RETURNING id""",
        bytes(32),
        silent_for_s,
    )
    return worker_id


async def _server(
    conn: asyncpg.Connection, since_s: float, seen_s: float, stale_after_s: float = 60.0
) -> None:
    """A server serving from `since_s` to `seen_s` seconds from now (negative: ago)."""
    await conn.execute(
        """INSERT INTO servers (id, serving_since, last_seen_at, stale_after_ms)
           VALUES ($1, now() + $2 * interval '1 second', now() + $3 * interval '1 second', $4)""",
        uuid.uuid4(),
        since_s,
        seen_s,
        round(stale_after_s * 1000),
    )


async def _offline(conn: asyncpg.Connection) -> list[uuid.UUID]:
    return await locks.silent_sessions(conn, RULE.intervals, RULE.floor_ms)


async def _silence_from(conn: asyncpg.Connection) -> datetime:
    found: datetime = await conn.fetchval("SELECT heartbeat_silence_from()")
    return found


async def test_without_any_server_row_silence_counts_from_the_last_heartbeat(
    tx: asyncpg.Connection,
) -> None:
    silent = await _worker(tx, 2 * HOUR)
    await _worker(tx, 0)
    assert await _offline(tx) == [silent]
    assert (await coordination.due(tx, RULE, 0.0)).silent_workers


async def test_a_live_server_serving_for_hours_changes_nothing(tx: asyncpg.Connection) -> None:
    await _server(tx, -3 * HOUR, 0)
    silent = await _worker(tx, 2 * HOUR)
    await _worker(tx, 0)
    assert await _offline(tx) == [silent]


async def test_after_an_outage_every_session_gets_a_full_threshold(
    tx: asyncpg.Connection,
) -> None:
    # The database was away for two hours; the server's first write since then started
    # a new stretch ten seconds ago. A session silent for the whole outage is not
    # offline yet, and becomes due a threshold after the stretch began.
    await _server(tx, -10, 0)
    await _worker(tx, 2 * HOUR)
    assert await _offline(tx) == []
    due = await coordination.due(tx, RULE, 0.0)
    assert not due.silent_workers
    assert due.next_due_in is not None
    assert 60 - 10 - 5 < due.next_due_in <= 60 - 10 + 1


async def test_while_no_server_is_live_no_silence_counts(tx: asyncpg.Connection) -> None:
    # The only server was last seen an hour ago: nothing could record a heartbeat since.
    await _server(tx, -3 * HOUR, -HOUR)
    await _worker(tx, 2 * HOUR)
    assert await _offline(tx) == []
    now: datetime = await tx.fetchval("SELECT clock_timestamp()")
    assert abs((await _silence_from(tx) - now).total_seconds()) < 5


async def test_a_server_restart_covered_by_another_server_grants_no_grace(
    tx: asyncpg.Connection,
) -> None:
    # One server live throughout; another restarted a minute ago (a new stretch of its
    # own). Workers could heartbeat the first all along: silence counts from hours ago.
    await _server(tx, -3 * HOUR, 0)
    await _server(tx, -60, 0)
    silent = await _worker(tx, 2 * HOUR)
    assert await _offline(tx) == [silent]
    since = await _silence_from(tx)
    assert since < await tx.fetchval("SELECT now() - interval '2 hours'")


async def test_a_gap_between_servers_restarts_the_count(tx: asyncpg.Connection) -> None:
    # Server A served until 30 minutes ago (stale one minute later); server B came up
    # 30 seconds ago: between them nobody could record a heartbeat, so the hours A
    # served before the gap count for nothing.
    await _server(tx, -3 * HOUR, -30 * 60)
    await _server(tx, -30, 0)
    await _worker(tx, 2 * HOUR)
    assert await _offline(tx) == []
    expected: datetime = await tx.fetchval("SELECT now() - interval '30 seconds'")
    assert await _silence_from(tx) == expected


async def test_overlapping_spans_chain_into_one_stretch(tx: asyncpg.Connection) -> None:
    # A then B then C, each starting before the previous went stale: one stretch from A.
    await _server(tx, -3 * HOUR, -2 * HOUR + 30)
    await _server(tx, -2 * HOUR, -HOUR + 30)
    await _server(tx, -HOUR, 0)
    expected: datetime = await tx.fetchval("SELECT now() - interval '3 hours'")
    assert await _silence_from(tx) == expected


async def test_a_write_after_a_gap_starts_a_new_stretch(tx: asyncpg.Connection) -> None:
    server_id = uuid.uuid4()
    first = await workers.record_liveness(tx, server_id, 5_000)
    assert await workers.record_liveness(tx, server_id, 5_000) == first
    assert await tx.fetchval("SELECT stale_after_ms FROM servers WHERE id = $1", server_id) == (
        workers.SERVER_STALE_AFTER_WRITES * 5_000
    )
    # Within two intervals of the last write: the same stretch.
    await tx.execute(
        """UPDATE servers SET serving_since = now() - interval '1 hour',
                              last_seen_at = now() - interval '9 seconds' WHERE id = $1""",
        server_id,
    )
    kept = await workers.record_liveness(tx, server_id, 5_000)
    assert kept == first - timedelta(hours=1)
    # Silent for longer than that (the server or the database was away): a new one.
    await tx.execute(
        "UPDATE servers SET last_seen_at = now() - interval '11 seconds' WHERE id = $1",
        server_id,
    )
    assert await workers.record_liveness(tx, server_id, 5_000) == first


async def test_rows_of_servers_gone_for_a_day_are_pruned(tx: asyncpg.Connection) -> None:
    await _server(tx, -30 * HOUR, -25 * HOUR)
    await _server(tx, -3 * HOUR, -2 * HOUR)
    await workers.record_liveness(tx, uuid.uuid4(), 5_000)
    assert await tx.fetchval("SELECT count(*) FROM servers") == 2
