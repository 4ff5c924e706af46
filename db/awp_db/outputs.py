"""Outputs fetched on their own: a lease's large upstream outputs, one task's output.

A lease or a GetRun answer carries outputs only while its size budget lasts
(awp_protocol.limits.MAX_RESPONSE_BYTES); these reads deliver the rest, each answer
within that budget as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from awp_db import leases
from awp_db.connect import Conn, Pool
from awp_db.queries import queries
from awp_kernel import errors
from awp_protocol.errors import Reason, quote

Q = queries("outputs")


def lease_lost() -> errors.AwpError:
    # Which check failed is not said: the caller only needs to stop.
    return errors.AwpError(
        errors.ErrorKind.FAILED_PRECONDITION,
        Reason.LEASE_LOST,
        "the lease is no longer held by this session: stop and report nothing",
    )


async def upstream_outputs(
    conn: Conn | Pool,
    worker_id: UUID,
    dispatch_id: int,
    lease_token: str,
    keys: Sequence[str],
    budget_bytes: int,
) -> list[tuple[str, dict[str, Any]]]:
    """The first of keys' outputs, in order, adding up to budget_bytes of JSON (at least
    one), for the live holder of the lease only; LEASE_LOST otherwise, INVALID_ARGUMENT
    naming `keys` for a key the lease's task does not depend on."""
    lease = await leases.live_lease(conn, worker_id, dispatch_id, lease_token)
    if lease is None:
        raise lease_lost()
    upstream = set(lease.depends_on)
    for index, key in enumerate(keys):
        if key not in upstream:
            raise errors.invalid(f"keys[{index}]", f"the task does not depend on {quote(key)}")
    if not keys:
        return []
    rows = await conn.fetch(Q["outputs"], lease.run_id, list(keys), budget_bytes)
    return [(row["key"], row["output"] or {}) for row in rows]


async def task_output(conn: Conn | Pool, run_id: UUID, task_key: str) -> dict[str, Any] | None:
    """The task's output (None if it has none yet); INVALID_ARGUMENT naming task_key if
    the run has no such task (the caller checked the run exists)."""
    rows = await conn.fetch(Q["task_output"], run_id, task_key)
    if not rows:
        raise errors.invalid("task_key", f"the run has no task {quote(task_key)}")
    output: dict[str, Any] | None = rows[0]["output"]
    return output
