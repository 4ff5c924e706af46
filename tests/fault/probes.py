"""Probes of database state the scenarios wait on (never sleeps standing in for them)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import asyncpg
from cluster import Cluster, wait_for

from awp_protocol.states import TERMINAL_RUN_STATES


async def wait_run(
    cluster: Cluster, run_id: UUID, state: str = "succeeded", within: float = 30.0
) -> None:
    """Waits for the run to end; fails at once if it ends in another state."""

    async def ended() -> str | None:
        found: str = await cluster.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
        if found in TERMINAL_RUN_STATES and found != state:
            raise AssertionError(f"run {run_id} ended {found}, expected {state}")
        return found if found == state else None

    await wait_for(ended, f"run {run_id} to be {state}", within=within)


async def wait_attempt(
    cluster: Cluster,
    run_id: UUID,
    key: str,
    attempt: int,
    state: str | None = None,
    within: float = 20.0,
) -> asyncpg.Record:
    async def found() -> asyncpg.Record | None:
        rows = await cluster.fetch(
            """
            SELECT a.attempt, a.state, a.worker_id::text AS worker_id, a.started_at,
                   a.finished_at, a.dispatch_id
              FROM attempts a JOIN tasks t ON t.id = a.task_id
             WHERE a.run_id = $1 AND t.key = $2 AND a.attempt = $3
               AND ($4::text IS NULL OR a.state = $4)
            """,
            run_id,
            key,
            attempt,
            state,
        )
        return rows[0] if rows else None

    what = f"attempt {attempt} of {key}" + (f" to be {state}" if state else "")
    return await wait_for(found, what, within=within)


async def wait_succeeded(
    cluster: Cluster, run_id: UUID, what: str, *, tasks: int = 0, attempts: int = 0
) -> None:
    """Waits until at least `tasks` of the run's tasks, or `attempts` of its attempts,
    have succeeded."""
    table, least = ("tasks", tasks) if tasks else ("attempts", attempts)
    query = f"SELECT count(*) >= $2 FROM {table} WHERE run_id = $1 AND state = 'succeeded'"
    await wait_for(lambda: cluster.fetchval(query, run_id, least), what)


async def revision(cluster: Cluster, run_id: UUID) -> int:
    value: int = await cluster.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
    return value


def seconds_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()
