"""Writing the end of attempts, the failure or cancellation of runs, and run completion.

One piece of code serves every path that ends an attempt: a worker's result, the
reaper (lease expired, deadline passed), a drain's hand-back and an offline worker.
Callers hold the run and dispatch locks (awp_db.locks) and flush the EventBatch afterwards.

A hand-back is an `interrupted` attempt that, while the task has free hand-backs left
(awp_kernel.retry.decide_hand_back), charges nothing: the task is ready again at once
and its `hand_backs` counts one more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from uuid import UUID

from asyncpg import Record

from awp_db import dynamic
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.locks import LockedDispatch
from awp_db.queries import named, queries
from awp_db.signals import COORDINATOR_CHANNEL
from awp_kernel.retry import (
    AttemptEnd,
    RetryPolicy,
    TaskDecision,
    decide,
    decide_hand_back,
)
from awp_kernel.states import run_outcome
from awp_protocol.limits import MAX_FREE_HAND_BACKS
from awp_protocol.results import NOTHING_REPLAYED, Replayed, StoredError
from awp_protocol.states import charged_attempts

Q = queries("settle")

# Dispatch state after each kind of attempt end.
_DISPATCH_STATE: dict[AttemptEnd, str] = {
    "succeeded": "completed",
    "failed": "completed",
    "interrupted": "expired",
    "timed_out": "expired",
}


@dataclass(frozen=True, slots=True)
class Ending:
    """One attempt that ended, and everything needed to apply the retry rule."""

    dispatch_id: int
    run_id: UUID
    task_id: int
    task_key: str
    attempt: int
    end: AttemptEnd
    policy: RetryPolicy
    # The task's free hand-backs before this ending; a hand-back is `interrupted`.
    hand_backs: int = 0
    # The task's attempts that ended SUSPENDED before this one (free of charge).
    suspensions: int = 0
    hand_back: bool = False
    output: dict[str, Any] | None = None
    # Its retryable flag is the one the retry rule reads (None: a success).
    error: StoredError | None = None
    result_hash: bytes | None = None
    # A failure's diagnostics, kept on its attempt only ("" for none): written by the
    # statement that ends the attempt, for a second write of the row would be checked
    # against its foreign keys again, taking locks out of order (awp_db.locks).
    traceback: str = ""
    log_tail: str = ""
    # What the attempt replayed from step memos: added to its task's savings.
    replayed: Replayed = Replayed()


@dataclass(frozen=True, slots=True)
class Settled:
    """What a settlement changed, for metrics and wake-ups."""

    tasks_succeeded: int = 0
    tasks_retrying: int = 0
    tasks_failed: int = 0
    tasks_unlocked: int = 0
    runs_finished: dict[UUID, str] = field(default_factory=dict)
    tasks_handed_back_free: int = 0  # ready again at once, nothing charged


def ending_of(
    row: LockedDispatch,
    end: AttemptEnd,
    *,
    output: dict[str, Any] | None = None,
    error: StoredError | None = None,
    digest: bytes | None = None,
    hand_back: bool = False,
    traceback: str = "",
    log_tail: str = "",
    replayed: Replayed = NOTHING_REPLAYED,
) -> Ending:
    """The Ending of a dispatch row locked for settlement (its attempt, task and policy)."""
    assert row.attempt is not None, "only a leased dispatch has an attempt to end"
    assert not hand_back or end == "interrupted", "a hand-back interrupts its attempt"
    return Ending(
        dispatch_id=row.id,
        run_id=row.run_id,
        task_id=row.task_id,
        task_key=row.task_key,
        attempt=row.attempt,
        end=end,
        policy=RetryPolicy(
            max_attempts=row.max_attempts,
            initial_backoff_ms=row.backoff_initial_ms,
            max_backoff_ms=row.backoff_max_ms,
            multiplier=row.backoff_multiplier,
        ),
        hand_backs=row.hand_backs,
        suspensions=row.suspensions,
        hand_back=hand_back,
        output=output,
        error=error,
        result_hash=digest,
        traceback=traceback,
        log_tail=log_tail,
        replayed=replayed,
    )


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


async def notify_coordinator(conn: Conn, why: str) -> None:
    """Wakes the coordinator at commit (why: for its logs)."""
    batch = EventBatch()
    batch.notify(COORDINATOR_CHANNEL, why)
    await batch.flush(conn)


def _decision(ending: Ending) -> TaskDecision:
    charged = charged_attempts(ending.attempt, ending.hand_backs, ending.suspensions)
    if ending.hand_back:
        return decide_hand_back(ending.policy, charged, ending.hand_backs)
    retryable = ending.error is None or ending.error.retryable
    return decide(ending.policy, charged, ending.end, retryable)


def _hand_back_payload(ending: Ending, decision: TaskDecision) -> dict[str, Any]:
    """What the events say of a hand-back: free or charged, and how many were free."""
    free = decision.task_state == "ready"
    return {
        "charged": not free,
        "free_hand_backs": ending.hand_backs + free,
        "max_free_hand_backs": MAX_FREE_HAND_BACKS,
    }


async def end_attempts(conn: Conn, endings: Sequence[Ending], events: EventBatch) -> Settled:
    """Applies the retry rule to each ended attempt, then what each task's end sets off:
    dependents unlocked, map tasks started or settled, a failure's policy applied (the
    run stopped, or the failed task's downstream skipped), always tasks released, runs
    finished."""
    if not endings:
        return Settled()
    decisions = [_decision(e) for e in endings]

    outputs = [_json(e.output) for e in endings]
    # Dispatch, attempt and task of every ending in one statement (one round trip).
    # The runs that may have finished: no live task left besides those ended here.
    may_have_finished: set[UUID] = set()
    finished: list[dynamic.Finished] = []
    for row in await conn.fetch(
        *named(
            Q["end_attempts"],
            dispatch_ids=[e.dispatch_id for e in endings],
            dispatch_states=[_DISPATCH_STATE[e.end] for e in endings],
            result_hashes=[e.result_hash for e in endings],
            attempt_states=[e.end for e in endings],
            outputs=outputs,
            errors=[None if e.error is None else json.dumps(e.error.to_json()) for e in endings],
            task_ids=[e.task_id for e in endings],
            task_states=[d.task_state for d in decisions],
            retry_in_ms=[d.retry_in_ms for d in decisions],
            tracebacks=[e.traceback or None for e in endings],
            log_tails=[e.log_tail or None for e in endings],
            saved_steps=[e.replayed.steps for e in endings],
            saved_tokens=[e.replayed.tokens for e in endings],
            saved_cost_usd=[e.replayed.cost_usd for e in endings],
        )
    ):
        if row["run_may_finish"]:
            may_have_finished.add(row["run_id"])
        if row["state"] in ("succeeded", "failed"):
            finished.append(finished_task(row))

    succeeded = retrying = failed = handed_back = 0
    for ending, decision in zip(endings, decisions, strict=True):
        payload: dict[str, Any] = {"dispatch_id": ending.dispatch_id}
        if ending.error is not None:
            payload["error"] = ending.error.to_json()
        task_payload: dict[str, Any] = {}
        if ending.hand_back:
            payload["hand_back"] = task_payload["hand_back"] = _hand_back_payload(ending, decision)
        if decision.retry_in_ms is not None:
            task_payload["retry_in_ms"] = decision.retry_in_ms
        events.attempt(
            ending.run_id, ending.task_key, ending.attempt, "running", ending.end, payload
        )
        events.task(
            ending.run_id,
            ending.task_key,
            "running",
            decision.task_state,
            ending.attempt,
            task_payload or None,
        )
        if decision.task_state == "succeeded":
            succeeded += 1
        elif decision.task_state == "waiting_retry":
            retrying += 1
        elif decision.task_state == "ready":
            handed_back += 1
        else:
            failed += 1

    unlocked, failed_runs, touched = await follow_up(conn, finished, events)
    if failed_runs:
        await stop_runs(conn, sorted(failed_runs), "skipped", events)
    # A run none of whose tasks is left live finishes now; the others cannot have.
    runs_finished = await finish_runs(conn, may_have_finished | failed_runs | touched, events)
    return Settled(succeeded, retrying, failed, unlocked, runs_finished, handed_back)


def finished_task(row: Record) -> dynamic.Finished:
    """A row with the columns of dynamic.Finished (and perhaps others)."""
    return dynamic.Finished(**{f.name: row[f.name] for f in fields(dynamic.Finished)})


async def follow_up(
    conn: Conn, finished: list[dynamic.Finished], events: EventBatch
) -> tuple[int, set[UUID], set[UUID]]:
    """What the tasks that ended for good set off, until nothing more ends: returns the
    tasks made ready, the runs that fail now and the runs where a map task ended or
    tasks were skipped (they may have finished)."""
    unlocked = 0
    failed_runs: set[UUID] = set()
    touched: set[UUID] = set()
    while finished:
        elements = [task for task in finished if task.parent_id is not None]
        declared = [task for task in finished if task.parent_id is None]
        later = await dynamic.elements_ended(conn, elements, events)
        # Successes unlock their dependents: a task is ready once all have succeeded (a
        # map task starts instead).
        unlock = [
            (task.run_id, key)
            for task in declared
            if task.state == "succeeded"
            for key in task.dependents
        ]
        started: list[dynamic.MapTask] = []
        if unlock:
            for row in await conn.fetch(
                Q["unlock_dependents"], [run for run, _ in unlock], [key for _, key in unlock]
            ):
                if row["state"] == "ready":
                    unlocked += 1
                    events.task(row["run_id"], row["key"], "pending", "ready")
                elif row["state"] == "running":
                    events.task(row["run_id"], row["key"], "pending", "running")
                    started.append(dynamic.MapTask(row["id"], row["run_id"], row["key"]))
        later.extend(await dynamic.start_maps(conn, started, events))
        # A failure applies its task's policy. An always task's failure is only recorded.
        failures = [t for t in declared if t.state == "failed" and not t.always]
        for task in failures:
            if task.on_failure == "fail_run":
                failed_runs.add(task.run_id)
        await dynamic.skip_downstream(
            conn, [t for t in failures if t.on_failure == "continue"], events
        )
        touched.update(task.run_id for task in later)
        touched.update(task.run_id for task in failures)
        finished = later
    return unlocked, failed_runs, touched


async def stop_runs(
    conn: Conn, run_ids: Sequence[UUID], untouched_state: str, events: EventBatch
) -> None:
    """Revokes every live lease of the runs and ends their unfinished tasks.

    Failure: untouched tasks are `skipped`, but always tasks are left to run when the
    rest has ended (none of them can be live yet: they start only once every other task
    is terminal). Cancellation: they are `canceled`, always tasks too. Running tasks are
    `canceled` either way, with their attempt; a worker still executing one hears
    REVOKED on its next heartbeat and its late result is LEASE_LOST.
    """
    await conn.execute(Q["cancel_live_dispatches"], list(run_ids))
    for row in await conn.fetch(Q["cancel_running_attempts"], list(run_ids)):
        events.attempt(row["run_id"], row["key"], row["attempt"], "running", "canceled")
    stop_always = untouched_state == "canceled"
    for row in await conn.fetch(Q["stop_tasks"], list(run_ids), untouched_state, stop_always):
        events.task(row["run_id"], row["key"], row["from_state"], row["to_state"])


async def finish_runs(conn: Conn, run_ids: Iterable[UUID], events: EventBatch) -> dict[UUID, str]:
    """Releases the always tasks whose turn has come; marks runs whose tasks are all
    terminal with the outcome those tasks imply."""
    finished: dict[UUID, str] = {}
    candidates = sorted(set(run_ids))
    if not candidates:
        return finished
    await dynamic.release_always(conn, candidates, events)
    outcomes = {
        row["id"]: run_outcome(row["task_states"], row["always_states"])
        for row in await conn.fetch(Q["finished_runs"], candidates)
    }
    if not outcomes:
        return finished
    ended = await conn.fetch(Q["finish_runs"], list(outcomes), list(outcomes.values()))
    for run_id in sorted(row["id"] for row in ended):
        events.run(run_id, "running", outcomes[run_id])
        finished[run_id] = outcomes[run_id]
    return finished
