"""What the coordinator reads to export spans about runs (docs/observability.md): the
runs finished since, and the attempts it ended itself (a lease expired, a worker gone
offline), which their workers, gone, cannot report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from awp_db.connect import Conn
from awp_db.queries import queries, rows_as

Q = queries("traces")
LOCKS = queries("locks")


@dataclass(frozen=True, slots=True)
class FinishedRun:
    id: UUID
    state: str
    created_at: datetime
    finished_at: datetime
    trace_id: str
    trace_span: str
    trace_parent: str | None
    workflow_name: str
    workflow_version: int


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    run_id: UUID
    task_key: str
    attempt: int
    worker_id: UUID
    fencing_token: int
    dispatch_id: int
    state: str
    started_at: datetime
    finished_at: datetime
    lease_expires_at: datetime | None
    trace_id: str
    trace_span: str


async def finished_runs(conn: Conn, limit: int) -> list[FinishedRun]:
    """Up to ``limit`` finished runs whose span is due, taken (each is returned once)."""
    return await rows_as(FinishedRun, conn, LOCKS["finished_traces"], limit)


async def ended_attempts(conn: Conn, dispatch_ids: Sequence[int]) -> list[EndedAttempt]:
    if not dispatch_ids:
        return []
    return await rows_as(EndedAttempt, conn, Q["ended_attempts"], list(dispatch_ids))
