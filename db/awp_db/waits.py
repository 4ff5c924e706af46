"""Waits that hold nothing (docs/design.md §16): an attempt reaching a wait (Await),
the signals and decisions that satisfy one, and the timers that end sleeps and time
waits out.

Every transaction here locks the task's run first, then (Await) its dispatch, in the
order of awp_db.locks: a wait, the signals of its run and a decision on it only change
under that run's lock, so a signal is consumed by exactly one wait, and each wait that
resumes consumes exactly one signal (or one decision, or its timer), in the transaction
that makes its task READY again. The outcome is stored as the wait's checkpoint, which
the next attempt replays instead of waiting again. A wait task (TaskDefinition.wait),
which no attempt runs, ends for good instead (awp_kernel.wait_tasks).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from awp_db import checkpoints, locks, settle, wait_spans
from awp_db.checkpoints import StoredCheckpoint
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.leadership import Term, transaction
from awp_db.queries import named, queries, row_as, rows_as
from awp_db.signals import COORDINATOR_CHANNEL, WAIT_RESUMED
from awp_kernel import errors
from awp_kernel.errors import invalid, not_found
from awp_kernel.fencing import ResultVerdict, holds_lease, judge_append
from awp_kernel.wait_tasks import WAIT_TASK_APPROVAL
from awp_protocol.errors import Reason, quote
from awp_protocol.results import Replayed, StoredError

Q = queries("waits")


class AwaitOutcome(StrEnum):
    SATISFIED = "satisfied"
    SUSPENDED = "suspended"
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True, slots=True)
class Wait:
    """A wait an attempt reached (AwaitRequest, checked)."""

    kind: str  # sleep, signal or approval
    name: str
    occurrence: int
    # SLEEP: its length; SIGNAL and APPROVAL: its timeout (None: none).
    due_in_ms: int | None
    prompt: str = ""
    role: str = ""


@dataclass(frozen=True, slots=True)
class Awaited:
    outcome: AwaitOutcome
    checkpoint: StoredCheckpoint | None = None
    due_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class _WaitingTask:
    id: int
    run_id: UUID
    key: str
    wait_kind: str
    wait_name: str
    wait_occurrence: int
    wait_role: str | None
    wait_attempt: int
    wait_task: bool
    wait_due_at: datetime | None
    wait_since: datetime


@dataclass(frozen=True, slots=True)
class SignalSent:
    signal_id: int
    # The task whose wait consumed it ("" while buffered).
    delivered_to: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Decided:
    task_state: str
    resumed_attempt: int
    decided_at: datetime
    # The role the wait asked for ("" for the default), checked by the caller.
    role: str


def _value(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


async def await_wait(
    conn: Conn,
    worker_id: UUID,
    dispatch_id: int,
    lease_token: str,
    wait: Wait,
    replayed: Replayed,
) -> Awaited:
    """The attempt of a live lease reaches a wait: SATISFIED with the checkpoint stored
    (this call's, or one stored before), SUSPENDED (the attempt ended, the task WAITING),
    or LEASE_LOST. Fenced as a result is: judged under the dispatch's row lock, taken
    after its run's."""
    events = EventBatch()
    async with conn.transaction():
        await locks.runs_of_dispatches(conn, [dispatch_id])
        rows = await locks.dispatches_for_settlement(conn, [dispatch_id])
        row = rows[0] if rows else None
        if row is None or row.attempt is None:
            return Awaited(AwaitOutcome.LEASE_LOST)
        holds = holds_lease(worker_id, lease_token, row.worker_id, row.lease_token_hash)
        key = (row.task_id, wait.kind, wait.name, wait.occurrence)
        if (
            judge_append(
                holds=holds,
                state=row.state,
                now=row.now,
                lease_expires_at=row.lease_expires_at,
                attempt_deadline=row.attempt_deadline,
            )
            is not ResultVerdict.ACCEPTED
        ):
            # The holder resending the Await its attempt suspended at (the answer lost)
            # hears SUSPENDED again; anything else from a lease that ended is LEASE_LOST.
            if holds and await conn.fetchval(Q["suspended_here"], *key, row.attempt):
                return Awaited(AwaitOutcome.SUSPENDED)
            return Awaited(AwaitOutcome.LEASE_LOST)
        stored = await row_as(StoredCheckpoint, conn, Q["checkpoint"], *key)
        if stored is not None:
            return Awaited(AwaitOutcome.SATISFIED, stored)
        satisfied_by: str | None = None
        if wait.kind == "sleep" and not wait.due_in_ms:
            satisfied_by = _value({"woke_at": row.now.isoformat()})
        elif wait.kind == "signal":
            signal = await conn.fetchrow(Q["take_signal"], row.run_id, wait.name, row.task_id)
            if signal is not None:
                satisfied_by = signal["payload_json"]
        if satisfied_by is not None:
            stored = await checkpoints.store_wait_outcome(
                conn,
                row.task_id,
                row.run_id,
                wait.kind,
                wait.name,
                wait.occurrence,
                satisfied_by,
                dispatch_id=row.id,
                attempt=row.attempt,
            )
            return Awaited(AwaitOutcome.SATISFIED, stored)
        due_at = await conn.fetchval(
            *named(
                Q["suspend"],
                dispatch_id=row.id,
                kind=wait.kind,
                name=wait.name,
                occurrence=wait.occurrence,
                prompt=wait.prompt or None,
                role=wait.role or None,
                due_in_ms=wait.due_in_ms,
                attempt=row.attempt,
                saved_steps=replayed.steps,
                saved_tokens=replayed.tokens,
                saved_cost_usd=replayed.cost_usd,
            )
        )
        waiting = {"kind": wait.kind, "name": wait.name, "occurrence": wait.occurrence}
        if due_at is not None:
            waiting["due_at"] = due_at.isoformat()
        events.attempt(row.run_id, row.task_key, row.attempt, "running", "suspended", waiting)
        events.task(row.run_id, row.task_key, "running", "waiting", row.attempt, waiting)
        if due_at is not None:
            # The coordinator sleeps until its next known timer: this one may be sooner.
            events.notify(COORDINATOR_CHANNEL, "wait")
        await events.flush(conn)
    return Awaited(AwaitOutcome.SUSPENDED, due_at=due_at)


async def _resume(
    conn: Conn,
    task: _WaitingTask,
    events: EventBatch,
    payload: dict[str, Any],
    spans: list[wait_spans.Resumed],
    *,
    ended: tuple[str, str | None, StoredError | None] | None = None,
) -> str:
    """The task leaves WAITING: READY to run again, or -- a wait task, which no attempt
    runs -- `ended` (state, output JSON, error) for good, with what that sets off (its
    dependents, its failure policy, its run's end). Returns the task's new state."""
    events.notify(COORDINATOR_CHANNEL, WAIT_RESUMED)
    if not task.wait_task:
        row = await conn.fetchrow(Q["resume"], task.id)
        events.task(task.run_id, task.key, "waiting", "ready", task.wait_attempt or None, payload)
        wait_spans.resumed(spans, task, row, payload)
        return "ready"
    assert ended is not None, "a wait task ends for good"
    state, output, error = ended
    row = await conn.fetchrow(
        Q["end_wait_task"],
        task.id,
        state,
        output,
        None if error is None else json.dumps(error.to_json()),
    )
    assert row is not None  # locked and waiting
    events.task(task.run_id, task.key, "waiting", state, None, payload)
    _, failed_runs, touched = await settle.follow_up(conn, [settle.finished_task(row)], events)
    if failed_runs:
        await settle.stop_runs(conn, sorted(failed_runs), "skipped", events)
    await settle.finish_runs(conn, {task.run_id} | failed_runs | touched, events)
    return state


async def _running_run(conn: Conn, run_id: UUID) -> locks.LockedRun:
    locked = await locks.runs(conn, [run_id])
    if not locked:
        raise not_found(Reason.RUN_NOT_FOUND, f"run {run_id}")
    return locked[0]


async def send_signal(
    conn: Conn,
    run_id: UUID,
    name: str,
    payload_json: str,
    request_id: str | None,
    sent_by: str,
) -> SignalSent:
    """Stores a signal for the run and, when a task waits for its name, consumes it
    for the oldest such wait (the task READY again); otherwise it stays buffered.
    RUN_NOT_FOUND; RUN_FINISHED once the run has ended (a repeated request_id answers
    the first call's signal, whatever the run's state since)."""
    events, spans = EventBatch(), wait_spans.pending()
    async with conn.transaction():
        run = await _running_run(conn, run_id)
        if request_id:
            sent = await conn.fetchrow(Q["signal_by_request"], run_id, request_id)
            if sent is not None:
                return SignalSent(sent["id"], sent["delivered_to"], duplicate=True)
        if run.state != "running":
            raise errors.AwpError(
                errors.ErrorKind.FAILED_PRECONDITION,
                Reason.RUN_FINISHED,
                f"run {run_id} has ended ({run.state}): it takes no signal",
            )
        signal_id = await conn.fetchval(
            Q["insert_signal"], run_id, name, payload_json, request_id or None, sent_by
        )
        task = await row_as(_WaitingTask, conn, Q["waiting_task"], run_id, "signal", name, None)
        delivered_to = ""
        if task is not None:
            taken = await conn.fetchrow(Q["take_signal"], run_id, name, task.id)
            assert taken is not None  # this very signal, at least
            await checkpoints.store_wait_outcome(
                conn,
                task.id,
                run_id,
                "signal",
                name,
                task.wait_occurrence,
                taken["payload_json"],
            )
            await _resume(conn, task, events, {"signal": name, "signal_id": taken["id"]}, spans)
            delivered_to = task.key
        await events.flush(conn)
    wait_spans.record(spans)
    return SignalSent(signal_id, delivered_to, duplicate=False)


def not_waiting(run_id: UUID, task_key: str, why: str) -> errors.AwpError:
    return errors.AwpError(
        errors.ErrorKind.FAILED_PRECONDITION,
        Reason.NOT_WAITING,
        f"task {task_key!r} of run {run_id} is not waiting for an approval: {why}",
    )


async def decide(
    conn: Conn,
    run_id: UUID,
    task_key: str,
    approved: bool,
    decided_by: str,
    comment: str,
    may_decide: Callable[[str], None],
) -> Decided:
    """Decides the approval the task waits for: its checkpoint records the decision
    and the task is READY again. may_decide(role) says whether the caller may decide
    an approval asking for that role (PERMISSION_DENIED otherwise, raised by it).
    RUN_NOT_FOUND; NOT_WAITING when the task does not wait for an approval now."""
    events, spans = EventBatch(), wait_spans.pending()
    async with conn.transaction():
        run = await _running_run(conn, run_id)
        if run.state != "running":
            raise not_waiting(run_id, task_key, f"the run has ended ({run.state})")
        task = await row_as(
            _WaitingTask, conn, Q["waiting_task"], run_id, "approval", None, task_key
        )
        if task is None:
            found = await conn.fetchrow(Q["task_by_key"], run_id, task_key)
            if found is None:
                raise invalid("task_key", f"run {run_id} has no task {quote(task_key)}")
            raise not_waiting(run_id, task_key, f"it is {found['state']}")
        may_decide(task.wait_role or "")
        decided_at = await conn.fetchval(Q["clock"])
        decision = {
            "approved": approved,
            "decided_by": decided_by,
            "comment": comment,
            "decided_at": decided_at.isoformat(),
        }
        await checkpoints.store_wait_outcome(
            conn,
            task.id,
            run_id,
            "approval",
            task.wait_name,
            task.wait_occurrence,
            _value(decision),
        )
        state = await _resume(
            conn,
            task,
            events,
            {**decision, "resumed_attempt": task.wait_attempt},
            spans,
            ended=(
                ("succeeded", _value(decision), None)
                if approved
                else ("failed", None, StoredError(_rejected(decided_by, comment), False))
            ),
        )
        await events.flush(conn)
    wait_spans.record(spans)
    return Decided(state, task.wait_attempt, decided_at, task.wait_role or "")


def _rejected(decided_by: str, comment: str) -> str:
    return f"rejected by {decided_by}" + (f": {comment}" if comment else "")


async def release_due(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Waits whose time has come (database clock): a sleep ends ({"woke_at"}), a signal
    or approval wait times out (its checkpoint says timed_out); the task is READY."""
    candidates = await conn.fetch(Q["due_waits"], limit)
    if not candidates:
        return 0
    events, spans = EventBatch(), wait_spans.pending()
    async with transaction(conn, term):
        locked = await locks.runs(conn, {row["run_id"] for row in candidates})
        running = [run.id for run in locked if run.state == "running"]
        due = await rows_as(
            _WaitingTask, conn, Q["lock_due_waits"], [row["id"] for row in candidates], running
        )
        for task in due:
            assert task.wait_due_at is not None
            sleep = task.wait_kind == "sleep"
            value = _value({"woke_at": task.wait_due_at.isoformat()}) if sleep else "null"
            await checkpoints.store_wait_outcome(
                conn,
                task.id,
                task.run_id,
                task.wait_kind,
                task.wait_name,
                task.wait_occurrence,
                value,
                timed_out=not sleep,
            )
            await _resume(
                conn,
                task,
                events,
                {"woke" if sleep else "timed_out": True},
                spans,
                ended=(
                    ("succeeded", value, None)
                    if sleep
                    else ("failed", None, StoredError("the approval timed out", False))
                ),
            )
        await events.flush(conn)
    wait_spans.record(spans)
    return len(due)


async def start_wait_tasks(conn: Conn, limit: int = 1000, *, term: Term | None = None) -> int:
    """Wait tasks that became ready: WAITING at once (no worker runs them)."""
    candidates = await conn.fetch(Q["ready_wait_tasks"], limit)
    if not candidates:
        return 0
    events = EventBatch()
    async with transaction(conn, term):
        locked = await locks.runs(conn, {row["run_id"] for row in candidates})
        running = [run.id for run in locked if run.state == "running"]
        started = await conn.fetch(
            Q["start_wait_tasks"],
            [row["id"] for row in candidates],
            running,
            WAIT_TASK_APPROVAL,
        )
        for row in started:
            waiting: dict[str, Any] = {"kind": row["wait_kind"]}
            if row["wait_due_at"] is not None:
                waiting["due_at"] = row["wait_due_at"].isoformat()
            events.task(row["run_id"], row["key"], "ready", "waiting", None, waiting)
        if any(row["wait_due_at"] is not None for row in started):
            events.notify(COORDINATOR_CHANNEL, "wait")
        await events.flush(conn)
    return len(started)
