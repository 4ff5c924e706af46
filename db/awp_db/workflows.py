"""Workflows: immutable, versioned definitions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from awp_db.connect import Conn, Pool
from awp_db.queries import queries
from awp_kernel.definition import WorkflowSpec
from awp_kernel.errors import AwpError, ErrorKind, not_found
from awp_protocol.errors import Reason

Q = queries("workflows")


@dataclass(frozen=True, slots=True)
class StoredWorkflow:
    id: int
    spec: WorkflowSpec
    created_at: datetime


def _stored(row: asyncpg.Record) -> StoredWorkflow:
    return StoredWorkflow(row["id"], WorkflowSpec.from_json(row["definition"]), row["created_at"])


async def create(conn: Conn | Pool, spec: WorkflowSpec) -> tuple[StoredWorkflow, bool]:
    """Stores a validated spec. Identical re-create: (existing, False); changed: conflict."""
    digest = spec.definition_hash()
    row = await conn.fetchrow(Q["insert"], spec.name, spec.version, spec.to_json(), digest)
    if row is not None:
        return StoredWorkflow(row["id"], spec, row["created_at"]), True
    existing = await conn.fetchrow(Q["get"], spec.name, spec.version)
    if existing is None:  # deleted in between: cannot happen, workflows are never deleted
        raise not_found(Reason.WORKFLOW_NOT_FOUND, f"workflow {spec.name}@{spec.version}")
    if bytes(existing["definition_hash"]) != digest:
        raise AwpError(
            ErrorKind.ALREADY_EXISTS,
            Reason.DEFINITION_CONFLICT,
            f"workflow {spec.name}@{spec.version} already exists with a different definition; "
            "workflows are immutable: create a new version",
            metadata={"name": spec.name, "version": str(spec.version)},
        )
    return _stored(existing), False


async def get(conn: Conn | Pool, name: str, version: int = 0) -> StoredWorkflow:
    """Version 0 means the latest."""
    if version:
        row = await conn.fetchrow(Q["get"], name, version)
    else:
        row = await conn.fetchrow(Q["get_latest"], name)
    if row is None:
        what = f"workflow {name}@{version}" if version else f"workflow {name}"
        raise not_found(Reason.WORKFLOW_NOT_FOUND, what)
    return _stored(row)


async def list_page(
    conn: Conn | Pool,
    name: str | None,
    after: tuple[str, int],
    limit: int,
) -> list[StoredWorkflow]:
    rows = await conn.fetch(Q["list"], name, after[0], after[1], limit)
    return [_stored(row) for row in rows]
