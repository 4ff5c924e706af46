"""Driving runs through the storage layer the way workers and the coordinator do: a fake
worker over awp_db (no gRPC, no process), the coordinator's cancel step, and readers of
run state. Tests observe the other layers against these real transitions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from awp_db import claims, dispatching, leases, locks, runs, settle, workers
from awp_db.connect import Pool
from awp_db.events import EventBatch

LEASE_TTL_MS = 60_000


@dataclass(frozen=True)
class DbWorker:
    """One worker session, registered and driven through awp_db as the server would."""

    registration: workers.Registration
    pool: Pool
    # Whether its Claims grant ready tasks when no offer is left (awp_db.claims); off in
    # tests of the coordinator's pass, which count what the pass alone granted.
    grants: bool = True

    @property
    def id(self) -> UUID:
        return self.registration.worker_id

    @property
    def worker_id(self) -> UUID:
        return self.registration.worker_id

    @property
    def session_token(self) -> str:
        return self.registration.session_token

    async def claim(self, n: int = 1000, ttl_ms: int = LEASE_TTL_MS) -> list[claims.IssuedLease]:
        call = claims.ClaimCall(str(self.id), self.session_token, n)
        async with self.pool.acquire() as conn:
            (issued,) = await claims.claim_many(conn, [call], ttl_ms, grant=self.grants)
        assert isinstance(issued, list), issued
        return issued

    async def dispatch_and_claim(self, n: int = 10) -> list[claims.IssuedLease]:
        """What the coordinator then a worker do: dispatch ready tasks, lease them."""
        await dispatch_all(self.pool)
        return await self.claim(n)

    async def complete_all(
        self,
        issued: Sequence[claims.IssuedLease],
        outcome: str = "succeeded",
        *,
        retryable: bool = True,
        output: Callable[[claims.IssuedLease], dict[str, Any]] | None = None,
    ) -> list[str]:
        """Reports every lease in one Complete; returns the verdicts' names. A success's
        output is output(lease), by default its task key and attempt."""
        succeeded = outcome == "succeeded"
        output = output or (lambda lease: {"task": lease.task_key, "attempt": lease.attempt})
        results = [
            leases.ResultIn(
                lease.dispatch_id,
                lease.lease_token,
                "succeeded" if succeeded else "failed",
                output=output(lease) if succeeded else None,
                error_message=None if succeeded else "boom",
                retryable=retryable,
            )
            for lease in issued
        ]
        call = leases.Completion(str(self.id), self.session_token, results)
        async with self.pool.acquire() as conn:
            (verdicts,) = await leases.complete_many(conn, [call])
        assert isinstance(verdicts, list), verdicts
        return [verdict.name for verdict in verdicts]

    async def complete(
        self,
        lease: claims.IssuedLease,
        outcome: str = "succeeded",
        *,
        retryable: bool = True,
        output: dict[str, Any] | None = None,
    ) -> str:
        (verdict,) = await self.complete_all(
            [lease],
            outcome,
            retryable=retryable,
            output=None if output is None else (lambda _: output),
        )
        return verdict

    async def drain(self, hand_back: Sequence[claims.IssuedLease] = ()) -> leases.DrainOutcome:
        refs = [leases.LeaseRef(lease.dispatch_id, lease.lease_token) for lease in hand_back]
        async with self.pool.acquire() as conn:
            return await leases.drain(conn, str(self.id), self.session_token, refs)


async def register(
    pool: Pool,
    kinds: Sequence[str] = ("mock",),
    *,
    max_concurrency: int = 10,
    name: str = "w",
    labels: dict[str, str] | None = None,
    heartbeat_interval_ms: int = 5_000,
    models: Sequence[str] = (),
    resources: dict[str, int] | None = None,
    grants: bool = True,
) -> DbWorker:
    async with pool.acquire() as conn:
        registration = await workers.register(
            conn,
            name,
            1,
            list(kinds),
            max_concurrency,
            labels or {},
            heartbeat_interval_ms=heartbeat_interval_ms,
            models=models,
            resources=resources,
        )
    return DbWorker(registration, pool, grants)


async def dispatch_all(pool: Pool) -> int:
    """The coordinator's dispatch step: every ready task gets a pending dispatch."""
    async with pool.acquire() as conn:
        return (await dispatching.create_dispatches(conn)).created


async def drive_to_end(pool: Pool, run_id: UUID, worker: DbWorker) -> str:
    """Claims and succeeds every dispatchable task (of any run) until this run finishes."""
    for _ in range(100):
        state = await run_state(pool, run_id)
        if state != "running":
            return state
        issued = await worker.dispatch_and_claim()
        assert issued, "a running run with nothing to claim: the test workflow is stuck"
        await worker.complete_all(issued, retryable=False)
    raise AssertionError("the run did not finish")


async def converge_cancel(pool: Pool, run_id: UUID) -> None:
    """What the coordinator does with a cancel request: stop everything, finish the run."""
    async with pool.acquire() as conn, conn.transaction():
        await locks.runs(conn, [run_id])
        events = EventBatch()
        await settle.stop_runs(conn, [run_id], "canceled", events)
        await settle.finish_runs(conn, [run_id], events)
        await events.flush(conn)


async def task_states(pool: Pool, run_id: UUID) -> dict[str, str]:
    return {task.key: task.state for task in await runs.tasks(pool, run_id)}


async def run_state(pool: Pool, run_id: UUID) -> str:
    state: str = await pool.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
    return state


async def revision(pool: Pool, run_id: UUID) -> int:
    value: int = await pool.fetchval("SELECT revision FROM runs WHERE id = $1", run_id)
    return value


async def events_of(pool: Pool, run_id: UUID) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        """SELECT type, task_key, attempt, from_state, to_state
             FROM state_events WHERE run_id = $1 ORDER BY seq""",
        run_id,
    )
    return [tuple(row) for row in rows]


@contextlib.asynccontextmanager
async def revocation_notices_off(pool: Pool) -> AsyncIterator[None]:
    """Leases revoked meanwhile send no notice (migration 0012's trigger is off), so no
    server pushes REVOKED for them: as when the notice is lost. Their holders hear of it
    from a heartbeat answer, or from a server's LISTEN reconnecting."""
    await pool.execute("ALTER TABLE dispatches DISABLE TRIGGER dispatches_lease_revoked")
    try:
        yield
    finally:
        await pool.execute("ALTER TABLE dispatches ENABLE TRIGGER dispatches_lease_revoked")
