"""Writing the end of attempts, the failure or cancellation of runs, and run completion.

One piece of code serves every path that ends an attempt: a worker's result, the
reaper (lease expired, deadline passed), a drain's hand-back and an offline worker.
Callers hold the locks (runs, then dispatches) and flush the EventBatch afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.queries import queries
from awp_kernel.retry import AttemptEnd, RetryPolicy, decide
from awp_kernel.states import run_outcome

Q = queries("settle")

COORDINATOR_CHANNEL = "awp_coordinator"

# Dispatch state after each kind of attempt end.
_DISPATCH_STATE: dict[AttemptEnd, str] = {
    "succeeded": "completed",
    "failed": "completed",
    "interrupted": "expired",
    "timed_out": "expired",
}


@dataclass(slots=True)
class Ending:
    """One attempt that ended, and everything needed to apply the retry rule."""

    dispatch_id: int
    run_id: UUID
    task_id: int
    task_key: str
    attempt: int
    end: AttemptEnd
    policy: RetryPolicy
    dependents: Sequence[str] = ()
    output: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    retryable: bool = True
    result_hash: bytes | None = None


@dataclass(slots=True)
class Settled:
    """What a settlement changed, for metrics and wake-ups."""

    tasks_succeeded: int = 0
    tasks_retrying: int = 0
    tasks_failed: int = 0
    tasks_unlocked: int = 0
    runs_finished: dict[UUID, str] = field(default_factory=dict)


def policy_of(row: asyncpg.Record | dict[str, Any]) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=row["max_attempts"],
        initial_backoff_ms=row["backoff_initial_ms"],
        max_backoff_ms=row["backoff_max_ms"],
        multiplier=row["backoff_multiplier"],
    )


def ending_of(
    row: asyncpg.Record,
    end: AttemptEnd,
    *,
    output: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    retryable: bool = True,
    digest: bytes | None = None,
) -> Ending:
    """The Ending of a dispatch row locked for settlement (its attempt, task and policy)."""
    return Ending(
        dispatch_id=row["id"],
        run_id=row["run_id"],
        task_id=row["task_id"],
        task_key=row["task_key"],
        attempt=row["attempt"],
        end=end,
        policy=policy_of(row),
        dependents=list(row["dependents"]),
        output=output,
        error=error,
        retryable=retryable,
        result_hash=digest,
    )


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


async def lock_runs(conn: Conn, run_ids: Iterable[UUID]) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(Q["lock_runs"], sorted(set(run_ids)))
    return rows


async def clock(conn: Conn) -> datetime:
    now: datetime = await conn.fetchval(Q["clock"])
    return now


async def notify_coordinator(conn: Conn, why: str) -> None:
    await conn.execute(Q["notify_coordinator"], why)


async def end_attempts(conn: Conn, endings: Sequence[Ending], events: EventBatch) -> Settled:
    """Applies the retry rule to each ended attempt; fails runs whose task failed for good."""
    settled = Settled()
    if not endings:
        return settled
    decisions = [decide(e.policy, e.attempt, e.end, e.retryable) for e in endings]

    outputs = [_json(e.output) for e in endings]
    # Dispatch, attempt and task of every ending in one statement (one round trip).
    # The runs that may have finished: no live task left besides those ended here.
    may_have_finished: set[UUID] = set()
    for row in await conn.fetch(
        Q["end_attempts"],
        [e.dispatch_id for e in endings],
        [_DISPATCH_STATE[e.end] for e in endings],
        [e.result_hash for e in endings],
        [e.end for e in endings],
        outputs,
        [_json(e.error) for e in endings],
        [e.task_id for e in endings],
        [d.task_state for d in decisions],
        [d.retry_in_ms for d in decisions],
    ):
        may_have_finished.add(row["run_id"])

    unlock_runs: list[UUID] = []
    unlock_keys: list[str] = []
    failed_runs: set[UUID] = set()
    for ending, decision in zip(endings, decisions, strict=True):
        payload: dict[str, Any] = {"dispatch_id": ending.dispatch_id}
        if ending.error is not None:
            payload["error"] = ending.error
        events.attempt(
            ending.run_id, ending.task_key, ending.attempt, "running", ending.end, payload
        )
        task_payload = (
            {"retry_in_ms": decision.retry_in_ms} if decision.retry_in_ms is not None else None
        )
        events.task(
            ending.run_id,
            ending.task_key,
            "running",
            decision.task_state,
            ending.attempt,
            task_payload,
        )
        if decision.task_state == "succeeded":
            settled.tasks_succeeded += 1
            for dependent in ending.dependents:
                unlock_runs.append(ending.run_id)
                unlock_keys.append(dependent)
        elif decision.task_state == "waiting_retry":
            settled.tasks_retrying += 1
        else:
            settled.tasks_failed += 1
            failed_runs.add(ending.run_id)

    if unlock_runs:
        for row in await conn.fetch(Q["unlock_dependents"], unlock_runs, unlock_keys):
            if row["state"] == "ready":
                settled.tasks_unlocked += 1
                events.task(row["run_id"], row["key"], "pending", "ready")
    if failed_runs:
        await stop_runs(conn, sorted(failed_runs), "skipped", events)
    # A run none of whose tasks is left live finishes now; the others cannot have.
    settled.runs_finished = await finish_runs(conn, may_have_finished | failed_runs, events)
    return settled


async def stop_runs(
    conn: Conn, run_ids: Sequence[UUID], untouched_state: str, events: EventBatch
) -> None:
    """Revokes every live lease of the runs and ends their unfinished tasks.

    Failure: untouched tasks are `skipped`. Cancellation: they are `canceled`. Running
    tasks are `canceled` either way, with their attempt; a worker still executing one
    hears REVOKED on its next heartbeat and its late result is LEASE_LOST.
    """
    await conn.execute(Q["cancel_live_dispatches"], list(run_ids))
    for row in await conn.fetch(Q["cancel_running_attempts"], list(run_ids)):
        events.attempt(row["run_id"], row["key"], row["attempt"], "running", "canceled")
    for row in await conn.fetch(Q["stop_tasks"], list(run_ids), untouched_state):
        events.task(row["run_id"], row["key"], row["from_state"], row["to_state"])


async def finish_runs(conn: Conn, run_ids: Iterable[UUID], events: EventBatch) -> dict[UUID, str]:
    """Marks runs whose tasks are all terminal with the outcome those tasks imply."""
    finished: dict[UUID, str] = {}
    candidates = sorted(set(run_ids))
    if not candidates:
        return finished
    for row in await conn.fetch(Q["finished_runs"], candidates):
        outcome = run_outcome(list(row["task_states"]))
        if await conn.fetchval(Q["finish_run"], row["id"], outcome) is not None:
            events.run(row["id"], "running", outcome)
            finished[row["id"]] = outcome
    return finished
