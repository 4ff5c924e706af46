"""Faults that need the victim in a known state at the instant they strike: a worker
frozen (SIGSTOP) or killed while it provably holds leases whose results it has not sent.

Read-then-act would race: between a query that finds the worker holding leases and the
signal, the leases may finish. So the worker is frozen first, its leases are read while
it cannot change them, and the fault strikes a frozen process. What it sent before the
freeze may still be on its way (a Complete the server has not committed yet), so only
leases whose action cannot have ended count: started less than the action's duration
before the freeze took hold, on the database clock, their result was not yet made.
"""

from __future__ import annotations

from datetime import datetime

from asyncpg import Record
from cluster import Cluster, WorkerProcess, wait_for


async def unsent_leases(cluster: Cluster, handle: WorkerProcess, action_s: float) -> list[Record]:
    """The leases a frozen worker holds whose actions (action_s long) cannot have ended
    before it froze. clock_timestamp() is read after the freeze took hold, so an attempt
    started within action_s of it was still running at the freeze."""
    return await cluster.fetch(
        """
        SELECT d.id AS dispatch_id, a.task_id, a.attempt
          FROM dispatches d JOIN attempts a ON a.dispatch_id = d.id
         WHERE d.state = 'leased' AND d.worker_id = $1::uuid AND a.state = 'running'
           AND a.started_at > clock_timestamp() - $2 * interval '1 second'
        """,
        handle.worker_id,
        action_s,
    )


async def freeze_holding(
    cluster: Cluster, handle: WorkerProcess, action_s: float, *, within: float = 20.0
) -> list[Record]:
    """Freezes the worker at a moment it holds at least one lease it has not reported
    (thawing it to try again otherwise); returns those leases, the worker left frozen."""
    process = handle.process

    async def frozen_holding() -> list[Record] | None:
        await process.freeze()
        held = await unsent_leases(cluster, handle, action_s)
        if not held:
            process.thaw()
        return held or None

    try:
        return await wait_for(
            frozen_holding, f"{process.name} frozen holding leases", within=within
        )
    except BaseException:
        if process.alive:
            process.thaw()
        raise


async def kill_holding(
    cluster: Cluster, handle: WorkerProcess, action_s: float, *, within: float = 20.0
) -> tuple[list[Record], datetime]:
    """kill -9 the worker at a moment it holds at least one lease it has not reported;
    returns those leases (each must run again elsewhere) and when it was killed, on the
    database clock."""
    held = await freeze_holding(cluster, handle, action_s, within=within)
    killed_at = await cluster.db_now()
    handle.process.kill()
    return held, killed_at
