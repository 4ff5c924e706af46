"""What a failed attempt keeps for whoever debugs it (its traceback and the action's last
log lines, beside the error every attempt keeps), and the attempt listing that shows it.

The error itself ({message, retryable, type}) is written with the attempt's end by
awp_db.settle, and copied to the task and the event; the traceback and log tail, written
in the same statement, stay on the attempt row, so that task rows, GetRun and event
streams stay small.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from awp_db.connect import Conn, Pool
from awp_db.queries import queries, rows_as

Q = queries("attempts")


@dataclass(frozen=True, slots=True)
class AttemptDetail:
    id: int
    task_key: str
    attempt: int
    state: str
    worker_id: UUID
    worker_name: str
    dispatch_id: int
    fencing_token: int
    started_at: datetime
    deadline: datetime
    finished_at: datetime | None
    error: dict[str, Any] | None
    traceback: str | None
    log_tail: str | None


async def page(
    conn: Conn | Pool, run_id: UUID, task_key: str | None, after_id: int, limit: int
) -> list[AttemptDetail]:
    """A run's attempts (or one task's) with every detail, oldest first, after an id."""
    return await rows_as(AttemptDetail, conn, Q["page"], run_id, task_key, after_id, limit)


async def final_tracebacks(conn: Conn | Pool, run_id: UUID, task_ids: list[int]) -> dict[str, str]:
    """The traceback of each of those tasks that failed, from its last attempt, by task
    key, where it kept one (only the tasks listed: a run may hold 100,000 failures)."""
    rows = await conn.fetch(Q["final_tracebacks"], run_id, task_ids)
    return {row["key"]: row["traceback"] for row in rows}


async def has_task(conn: Conn | Pool, run_id: UUID, key: str) -> bool:
    found: bool = await conn.fetchval(Q["has_task"], run_id, key)
    return found
