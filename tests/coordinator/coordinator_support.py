"""Helpers for coordinator tests: workers and leases made through the
storage layer, and the invariants checked on database state after every step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import support
from awp_coordinator import Coordinator, CoordinatorConfig, PassReport
from awp_db import leases, runs, workers
from awp_db.connect import Pool

T = TypeVar("T")


async def poll_until(
    probe: Callable[[], Awaitable[T]], *, within: float = 20.0, interval: float = 0.02
) -> T:
    """support.poll_until, with room for a coordinator scan or a leadership change."""
    return await support.poll_until(probe, within=within, interval=interval)


async def pass_until(
    coord: Coordinator, done: Callable[[PassReport], bool], *, within: float = 20.0
) -> PassReport:
    """Runs passes until one reports what done() looks for; fails after `within` s."""

    async def probe() -> PassReport | None:
        report = await coord.run_pass()
        return report if done(report) else None

    found = await poll_until(probe, within=within)
    assert found is not None
    return found


@dataclass
class Worker:
    registration: workers.Registration
    pool: Pool

    @property
    def id(self) -> UUID:
        return self.registration.worker_id

    async def claim(self, n: int = 1000, ttl_ms: int = 60_000) -> list[leases.IssuedLease]:
        async with self.pool.acquire() as conn:
            return await leases.claim(
                conn, str(self.id), self.registration.session_token, n, ttl_ms
            )

    async def complete(
        self, lease: leases.IssuedLease, outcome: str = "succeeded", *, retryable: bool = True
    ) -> str:
        result = leases.ResultIn(
            lease.dispatch_id,
            lease.lease_token,
            "succeeded" if outcome == "succeeded" else "failed",
            output={"ok": True} if outcome == "succeeded" else None,
            error_message=None if outcome == "succeeded" else "boom",
            retryable=retryable,
        )
        async with self.pool.acquire() as conn:
            (verdict,) = await leases.complete(
                conn, str(self.id), self.registration.session_token, [result]
            )
        return verdict.name

    async def drain(self) -> leases.DrainOutcome:
        async with self.pool.acquire() as conn:
            return await leases.drain(conn, str(self.id), self.registration.session_token, [])


async def register(
    pool: Pool,
    kinds: Sequence[str] = ("mock",),
    max_concurrency: int = 10,
    name: str = "w",
    heartbeat_interval_ms: int = 5_000,
) -> Worker:
    async with pool.acquire() as conn:
        registration = await workers.register(
            conn,
            name,
            1,
            list(kinds),
            max_concurrency,
            {},
            heartbeat_interval_ms=heartbeat_interval_ms,
        )
    return Worker(registration, pool)


def coordinator(pool: Pool, dsn: str = "", **overrides: Any) -> Coordinator:
    settings: dict[str, Any] = {
        "database_url": dsn,
        "metrics_listen": None,
        "instance": "test",
        # These tests count dispatches against free slots exactly; prefetch (the
        # production default) has tests of its own.
        "dispatch_prefetch": 0.0,
    }
    settings.update(overrides)
    return Coordinator(pool, CoordinatorConfig(**settings))


async def task_states(pool: Pool, run_id: UUID) -> dict[str, str]:
    return {row["key"]: row["state"] for row in await runs.tasks(pool, run_id)}


async def run_state(pool: Pool, run_id: UUID) -> str:
    state: str = await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
    return state


async def check_invariants(
    pool: Pool, *, global_limit: int = 0, finished: bool = False
) -> dict[str, int]:
    """Asserts what must hold in every committed state; returns a few counts."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        live = await conn.fetchval(
            "SELECT count(*) FROM dispatches WHERE state IN ('pending', 'leased')"
        )
        if global_limit:
            assert live <= global_limit, f"{live} live dispatches over the limit {global_limit}"
        over = await conn.fetch(
            """SELECT r.id, r.concurrency, count(t.id) AS n
                 FROM runs r JOIN tasks t ON t.run_id = r.id
                WHERE r.concurrency > 0 AND t.state IN ('queued', 'running')
                GROUP BY r.id HAVING count(t.id) > r.concurrency"""
        )
        assert not over, f"runs over their concurrency: {[dict(r) for r in over]}"
        busy = await conn.fetch(
            """SELECT w.id, w.max_concurrency, count(d.id) AS n
                 FROM workers w JOIN dispatches d ON d.worker_id = w.id AND d.state = 'leased'
                GROUP BY w.id HAVING count(d.id) > w.max_concurrency"""
        )
        assert not busy, f"workers over max_concurrency: {[dict(r) for r in busy]}"
        # A task's state agrees with its dispatches and attempts.
        mismatched = await conn.fetch(
            """SELECT t.id, t.state,
                      (SELECT count(*) FROM dispatches d
                        WHERE d.task_id = t.id AND d.state = 'pending') AS pending,
                      (SELECT count(*) FROM dispatches d
                        WHERE d.task_id = t.id AND d.state = 'leased') AS leased,
                      (SELECT count(*) FROM attempts a
                        WHERE a.task_id = t.id AND a.state = 'running') AS running,
                      (SELECT count(*) FROM attempts a WHERE a.task_id = t.id) AS attempts,
                      t.attempts AS counted
                 FROM tasks t"""
        )
        for row in mismatched:
            expected = {
                "queued": (1, 0, 0),
                "running": (0, 1, 1),
            }.get(row["state"], (0, 0, 0))
            got = (row["pending"], row["leased"], row["running"])
            assert got == expected, f"task {row['id']} {row['state']}: {got} != {expected}"
            assert row["attempts"] == row["counted"], f"task {row['id']} attempts mismatch"
        # No lease held by a session that can no longer heartbeat.
        orphaned = await conn.fetchval(
            """SELECT count(*) FROM dispatches d JOIN workers w ON w.id = d.worker_id
                WHERE d.state = 'leased' AND w.state IN ('stopped', 'offline')"""
        )
        assert orphaned == 0, f"{orphaned} leases held by stopped/offline workers"
        # Revisions and event seqs are contiguous per run.
        gaps = await conn.fetch(
            """SELECT r.id FROM runs r
                WHERE r.last_seq <> (SELECT count(*) FROM state_events e WHERE e.run_id = r.id)
                   OR r.revision <> (SELECT count(DISTINCT revision) FROM state_events e
                                      WHERE e.run_id = r.id)
                   OR r.revision <> coalesce((SELECT max(revision) FROM state_events e
                                               WHERE e.run_id = r.id), 0)"""
        )
        assert not gaps, f"runs with gaps in seq or revision: {[r['id'] for r in gaps]}"
        # Finished runs have nothing live.
        live_in_finished = await conn.fetchval(
            """SELECT count(*) FROM tasks t JOIN runs r ON r.id = t.run_id
                WHERE r.state <> 'running'
                  AND t.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry')"""
        )
        assert live_in_finished == 0
        if finished:
            unfinished = await conn.fetchval("SELECT count(*) FROM runs WHERE state = 'running'")
            assert unfinished == 0, f"{unfinished} runs still running"
        leased = await conn.fetchval("SELECT count(*) FROM dispatches WHERE state = 'leased'")
    return {"live": live, "leased": leased}


async def events_of(pool: Pool, run_id: UUID) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        """SELECT type, task_key, attempt, from_state, to_state
             FROM state_events WHERE run_id = $1 ORDER BY seq""",
        run_id,
    )
    return [tuple(row) for row in rows]
