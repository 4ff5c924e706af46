"""Every statement that takes row locks, and the one order they are taken in.

LOCK ORDER (DESIGN.md §6), over every relation:

  leader row -> schedule rows -> dispatch advisory lock -> worker session rows
    -> run rows -> dispatch rows -> task rows -> attempt rows -> state_events
    -> rate limit rows

1. The leader row (`leader_term`, FOR KEY SHARE), first in every transaction a leading
   coordinator runs; nothing else locks it but the lease's own one-statement updates
   (awp_db.leadership), which hold no other lock.
1b. Schedule rows, ascending id (`schedules`): a tick's firing (the coordinator skips
   busy ones), a trigger, a backfill, every change of a schedule; then the runs those
   start or cancel (awp_db.schedules).
2. The dispatch advisory lock (awp_db.dispatching): dispatch creation only, before any
   row, so two coordinators queue for it holding nothing but (1). A Claim that grants
   (dispatching.grant_for_claims) waits for it only as its first statement, when no offer
   is left and a task is ready (serialise_for_claims); later, holding its sessions (3)
   and runs (4), it only tries it (pg_try_advisory_xact_lock), never waits. A Complete
   that claims (awp_db.cycles) never waits for it: it only tries it, after (3)-(7).
3. Worker session rows, ascending id: a Claim's sessions, a drain's, a lost stream's, a
   batch of heartbeats (workers.touch); the offline sweep skips busy ones.
4. Run rows, ascending id, in one statement per transaction (a transaction that needs
   more later takes them SKIP LOCKED: a Claim's second round, retention's batch, the
   claim part of a Complete that claims, which locked its sessions (3) before the
   settlement's runs and takes every later run and offer SKIP LOCKED).
5. Dispatch rows of runs the transaction holds, in any number of statements: whoever
   else waits for those rows holds the run first, so waits behind this transaction
   before it holds any of them. The exceptions lock leases without their run -- a
   heartbeat's renewal and a lost stream's shortening (awp_db.leases) -- and those
   never wait for a lease while holding another: they lock the free ones SKIP LOCKED,
   then wait for each busy one alone (`lease`), in a statement or transaction of its
   own; an output stream's append and a step memo's write (`lease_for_memo`) wait for
   their one lease holding no other row, then write only rows of their own (stream
   chunks, checkpoints) whose foreign-key checks take FOR KEY SHARE (the task, the
   dispatch), which no lock of the order waits for. A Claim takes pending dispatches
   SKIP LOCKED.
6. Task, attempt and event rows are written only under their run's lock, so no two
   transactions ever contend for them in another order; so are rate charges (a
   dispatch's, under its run and dispatch locks), signal rows and a wait's checkpoint
   (awp_db.waits): an Await locks its run (`runs_of_dispatches`), then its dispatch
   (`dispatches_for_settlement`), as settlement does; SendSignal, Approve, Reject and the
   wait timers lock the run, then only rows of that run (its tasks `FOR NO KEY UPDATE`,
   its signals, its checkpoints).
7. Rate limit rows, ascending name (`rate_limits`), last: a Complete's slow-down
   reports and SetRateLimit (holding the dispatch lock, nothing else). A grant reads
   them without locking (the dispatch lock serialises it with SetRateLimit).

Lock strength. Every lock of the order is FOR NO KEY UPDATE, the strength an UPDATE
that changes no key takes anyway. PostgreSQL's foreign-key checks lock the referenced
row FOR KEY SHARE at the end of a statement that inserts a row, changes a foreign key,
or updates a row a second time in its transaction -- the worker's session row, the
run, the task or the dispatch an attempt points to -- out of any order. FOR KEY SHARE
conflicts only with FOR UPDATE (a delete, a key change), so no lock of the order may be
FOR UPDATE: a Claim holding its session FOR UPDATE while waiting for a run deadlocked
with a settlement of that run whose second write of a failed attempt (its traceback)
re-checked the attempt's worker (issue 25). The only FOR UPDATE locks are on rows
nothing can reference meanwhile: retention's finished runs (taken SKIP LOCKED, and
their rows deleted child first) and a Claim's pending dispatches (SKIP LOCKED; leasing
rewrites fencing_token, a key). And no transaction writes a row twice where one
statement can do it (settle.end_attempts writes a failure's diagnostics with its end).

Apart from the order: a server's liveness write (workers.sql record_liveness) upserts
its own `servers` row and prunes others' stale ones SKIP LOCKED, holding nothing else;
two concurrent CreateWorkflow calls of one version meet only in its unique index.

A statement that skips locked rows (SKIP LOCKED) never waits, so cannot break the
order. Every other comment about locking points here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from awp_db.connect import Conn
from awp_db.queries import queries, row_as, rows_as
from awp_kernel.retry import AttemptEnd

Q = queries("locks")


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A worker session's row, as authentication reads it."""

    id: UUID
    state: str
    session_token_hash: bytes
    executor_kinds: list[str]
    max_concurrency: int
    stream_epoch: int
    placement_labels: list[str]
    resource_names: list[str]
    resource_units: list[int]


@dataclass(frozen=True, slots=True)
class LockedRun:
    id: UUID
    state: str
    cancel_requested_at: datetime | None


@dataclass(frozen=True, slots=True)
class LockedDispatch:
    """A dispatch locked for settlement, with what settling its attempt needs."""

    id: int
    run_id: UUID
    task_id: int
    state: str
    worker_id: UUID | None
    lease_token_hash: bytes | None
    result_hash: bytes | None
    lease_expires_at: datetime | None
    attempt_deadline: datetime | None
    # None for a dispatch never leased (no attempt).
    attempt: int | None
    task_key: str
    max_attempts: int
    hand_backs: int  # the task's free hand-backs so far
    suspensions: int  # the task's attempts that ended SUSPENDED (free, §16)
    backoff_initial_ms: int
    backoff_max_ms: int
    backoff_multiplier: float
    # The live clock, read once the row was locked.
    now: datetime


@dataclass(frozen=True, slots=True)
class ExpiredDispatch(LockedDispatch):
    ending: AttemptEnd


# --- session rows ----------------------------------------------------------------------


async def session(conn: Conn, worker_id: UUID) -> SessionRow | None:
    found = await rows_as(SessionRow, conn, Q["session"], worker_id)
    return found[0] if found else None


async def sessions(conn: Conn, worker_ids: Iterable[UUID]) -> list[SessionRow]:
    return await rows_as(SessionRow, conn, Q["sessions"], sorted(set(worker_ids)))


async def silent_sessions(conn: Conn, intervals: int, floor_ms: int) -> list[UUID]:
    """Sessions silent for `intervals` of their own heartbeat interval, and `floor_ms`."""
    rows = await conn.fetch(Q["silent_sessions"], intervals, floor_ms)
    return [row["id"] for row in rows]


# --- schedule rows ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LockedSchedule:
    id: UUID
    name: str
    workflow_name: str
    workflow_version: int
    input: dict[str, Any]
    cron: str | None
    interval_ms: int | None
    timezone: str
    overlap: str
    catchup: str
    catchup_window_ms: int
    paused: bool
    next_tick_at: datetime


async def rate_limits(conn: Conn, names: Iterable[str]) -> None:
    await conn.fetch(Q["rate_limits"], sorted(set(names)))


async def schedules(
    conn: Conn, schedule_ids: Iterable[UUID], *, skip_locked: bool
) -> list[LockedSchedule]:
    """Schedule rows, locked; skip_locked leaves out rows another transaction holds."""
    query = Q["schedules"] + (" SKIP LOCKED" if skip_locked else "")
    return await rows_as(LockedSchedule, conn, query, sorted(set(schedule_ids)))


# --- run rows --------------------------------------------------------------------------


async def runs(conn: Conn, run_ids: Iterable[UUID]) -> list[LockedRun]:
    return await rows_as(LockedRun, conn, Q["runs"], sorted(set(run_ids)))


async def free_runs(conn: Conn, run_ids: Iterable[UUID]) -> list[LockedRun]:
    """The runs no other transaction holds, locked; busy ones are left out."""
    return await rows_as(LockedRun, conn, Q["free_runs"], sorted(set(run_ids)))


async def expired_runs(conn: Conn, cutoff: datetime, limit: int) -> list[UUID]:
    """Up to `limit` runs that finished before cutoff, oldest first, locked; busy ones
    are left out (awp_db.retention deletes them)."""
    return [row["id"] for row in await conn.fetch(Q["expired_runs"], cutoff, limit)]


async def runs_of_dispatches(conn: Conn, dispatch_ids: Sequence[int]) -> None:
    await conn.fetch(Q["runs_of_dispatches"], list(dispatch_ids))


@dataclass(frozen=True, slots=True)
class ClaimableRun:
    id: UUID
    # It has a pending dispatch with placement requirements (awp_db.placement).
    placed: bool


async def claimable_runs(
    conn: Conn,
    kinds: Sequence[str],
    limit: int,
    *,
    skip_locked: bool,
    labels: Collection[str] = (),
    resources: Collection[str] = (),
) -> list[ClaimableRun]:
    """Runs owning the oldest pending dispatches of these kinds that claimers of these
    labels and resources could take, locked; skip_locked leaves out (instead of waiting
    for) runs another transaction holds."""
    query = Q["claimable_runs"] + (" SKIP LOCKED" if skip_locked else "")
    return await rows_as(
        ClaimableRun, conn, query, list(kinds), limit, sorted(labels), sorted(resources)
    )


# --- dispatch rows ---------------------------------------------------------------------


async def dispatches_for_settlement(
    conn: Conn, dispatch_ids: Sequence[int]
) -> list[LockedDispatch]:
    return await rows_as(LockedDispatch, conn, Q["dispatches_for_settlement"], list(dispatch_ids))


async def lease(conn: Conn, dispatch_id: int, worker_id: UUID) -> bool:
    """Waits for one lease of the worker and locks it; False if no longer its lease."""
    return await conn.fetchval(Q["lease"], dispatch_id, worker_id) is not None


@dataclass(frozen=True, slots=True)
class MemoLease:
    """A step memo's writer, its dispatch locked (awp_db.checkpoints.record_step)."""

    id: int
    run_id: UUID
    task_id: int
    state: str
    worker_id: UUID | None
    lease_token_hash: bytes | None
    lease_expires_at: datetime | None
    attempt_deadline: datetime | None
    fencing_token: int
    attempt: int
    now: datetime


async def lease_for_memo(conn: Conn, dispatch_id: int) -> MemoLease | None:
    """Waits for one dispatch row and locks it, holding no other (as an append to an
    output stream): rule 5's exception, a lease locked without its run."""
    return await row_as(MemoLease, conn, Q["lease_for_memo"], dispatch_id)


async def expired_dispatches(conn: Conn, dispatch_ids: Sequence[int]) -> list[ExpiredDispatch]:
    """The leases among these that are still past their expiry or deadline, locked."""
    return await rows_as(ExpiredDispatch, conn, Q["expired_dispatches"], list(dispatch_ids))


# --- the leader row --------------------------------------------------------------------


async def leader_term(conn: Conn, holder: str, epoch: int, idle_limit_ms: int) -> bool:
    """Whether (holder, epoch) still leads, holding that term until the transaction ends
    (see locks.sql: a takeover waits for it, and the transaction may idle for at most
    idle_limit_ms)."""
    row = await conn.fetchrow(Q["leader_term"], holder, epoch, idle_limit_ms)
    return row is not None
