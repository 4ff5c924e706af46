"""Claim: leasing pending dispatches to the workers' free slots (DESIGN.md §4).

One transaction serves a batch of Claim calls, possibly of different sessions. Locks
follow awp_db.locks: the calling sessions' rows, then the runs of the dispatches to
lease, then those dispatches. Every time comes from the database clock.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from awp_common.tracing import TraceRef
from awp_db import dispatching, locks, placement, workers
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.queries import named, queries
from awp_db.signals import DISPATCH_CHANNEL
from awp_kernel import errors, tokens
from awp_protocol.limits import MAX_CLAIM_INPUT_JSON_BYTES, MAX_INLINE_OUTPUT_JSON_BYTES
from awp_protocol.names import idempotency_key

Q = queries("claims")
log = logging.getLogger("awp.db.claims")


@dataclass(frozen=True, slots=True)
class ClaimCall:
    """One Claim call: a session asking for up to max_leases leases."""

    worker_id: str
    session_token: str
    max_leases: int


@dataclass(frozen=True, slots=True)
class IssuedLease:
    dispatch_id: int
    lease_token: str
    fencing_token: int
    run_id: UUID
    task_key: str
    executor_kind: str
    action: str
    input: dict[str, Any]
    attempt: int
    max_attempts: int
    lease_expires_at: datetime
    lease_remaining_ms: float
    attempt_deadline: datetime
    attempt_remaining_ms: float
    run_input: dict[str, Any]
    # The upstream outputs small enough to travel in the lease, and the keys of the rest.
    upstream_outputs: dict[str, dict[str, Any]]
    omitted_upstream_keys: tuple[str, ...]
    upstream_states: dict[str, str]
    # The run's span (None: not traced), and when the task became ready and was leased.
    trace: TraceRef | None
    ready_at: datetime | None
    leased_at: datetime

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.run_id, self.task_key)


class ClaimAbandoned(Exception):
    """A caller went away before its leases were committed: everything was rolled back."""


@dataclass(slots=True)
class _Claimer:
    """A call of the batch whose session may be issued leases, and what it got so far."""

    index: int
    session: workers.Session
    slots: int
    issued: list[IssuedLease] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return self.slots - len(self.issued)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted(self.session.executor_kinds))

    @property
    def worker_id(self) -> UUID:
        return self.session.worker_id

    @property
    def capacity(self) -> dict[str, int]:
        return dict(self.session.capacity)


async def claim_many(
    conn: Conn,
    calls: Sequence[ClaimCall],
    lease_ttl_ms: int,
    *,
    still_wanted: Callable[[int], bool] | None = None,
    grant: bool = True,
) -> list[list[IssuedLease] | errors.AwpError]:
    """Several Claim calls in one transaction, one answer per call, in order.

    Each call gets at most its session's free slots, counted after its row is locked
    (two calls of one session share them); earlier calls are served first. A call
    whose session is invalid or draining gets its error back (returned, not raised)
    and nothing else changes for it.

    still_wanted(i), asked just before commit, tells whether call i's caller still
    waits; if one that was issued leases does not, the transaction is rolled back and
    run again for the callers still waiting (a departed one is answered with no lease),
    so no lease is ever committed for nobody. ClaimAbandoned once none is left.

    grant: slots the offers leave empty are granted ready tasks here (_grant_and_lease).
    """
    waiting = list(range(len(calls)))

    def wanted(position: int) -> bool:
        # position is the call's place among those still waiting, not in calls.
        return still_wanted is None or still_wanted(waiting[position])

    while True:
        try:
            answers = await _claim_once(
                conn, [calls[index] for index in waiting], lease_ttl_ms, wanted, grant
            )
        except ClaimAbandoned:
            assert still_wanted is not None  # only it abandons a transaction
            departed = [index for index in waiting if not still_wanted(index)]
            log.debug("Claim batch rolled back for %d departed callers", len(departed))
            waiting = [index for index in waiting if index not in departed]
            if not waiting:
                raise
            continue
        by_call = dict(zip(waiting, answers, strict=True))
        return [by_call.get(index, []) for index in range(len(calls))]


async def _claim_once(
    conn: Conn,
    calls: Sequence[ClaimCall],
    lease_ttl_ms: int,
    still_wanted: Callable[[int], bool],
    grant: bool,
) -> list[list[IssuedLease] | errors.AwpError]:
    """One transaction of claim_many; ClaimAbandoned (rolled back) if a caller that was
    issued leases no longer waits."""
    events = EventBatch()
    async with conn.transaction():
        if grant:
            await dispatching.serialise_for_claims(conn)
        sessions = await workers.authenticate_many(
            conn, [(call.worker_id, call.session_token) for call in calls], for_update=True
        )
        issued = await lease_in(
            conn, calls, sessions, lease_ttl_ms, events, grant=grant, runs_held=False
        )
        if any(leases and not still_wanted(index) for index, leases in issued.items()):
            raise ClaimAbandoned()
        await events.flush(conn)
    return [_answer(session, issued.get(index, [])) for index, session in enumerate(sessions)]


async def lease_in(
    conn: Conn,
    calls: Sequence[ClaimCall],
    sessions: Sequence[workers.Session | errors.AwpError],
    lease_ttl_ms: int,
    events: EventBatch,
    *,
    grant: bool,
    runs_held: bool,
) -> dict[int, list[IssuedLease]]:
    """The leasing of a Claim transaction its caller holds, the calls' sessions locked
    (for_update): the leases issued, by call index (active sessions with free slots
    only). runs_held: the transaction already locked runs (a Complete's settlement,
    awp_db.cycles), so the lock order lets it take more only SKIP LOCKED."""
    claimers = await _claimers(conn, calls, sessions)
    # First the runs of the oldest pending dispatches, waited for. Concurrent claims
    # may have taken some of those meanwhile: a short batch then adds whatever other
    # runs are free right now rather than answering with slots left empty.
    if runs_held or await _lease_round(conn, claimers, lease_ttl_ms, events, skip_locked=False):
        await _lease_round(conn, claimers, lease_ttl_ms, events, skip_locked=True)
    if grant:
        await _grant_and_lease(conn, claimers, lease_ttl_ms, events)
    return {claimer.index: claimer.issued for claimer in claimers}


def _answer(
    session: workers.Session | errors.AwpError, issued: list[IssuedLease]
) -> list[IssuedLease] | errors.AwpError:
    if isinstance(session, errors.AwpError):
        return session
    if session.state != "active":
        return errors.worker_draining()
    return issued


async def _claimers(
    conn: Conn, calls: Sequence[ClaimCall], sessions: Sequence[workers.Session | errors.AwpError]
) -> list[_Claimer]:
    """The calls of active sessions that have slots to offer, in call order."""
    active = {
        session.worker_id: session
        for session in sessions
        if isinstance(session, workers.Session) and session.state == "active"
    }
    if not active:
        return []
    held = await workers.active_lease_counts(conn, list(active))
    free = {worker: session.max_concurrency - held[worker] for worker, session in active.items()}
    claimers: list[_Claimer] = []
    for index, (call, session) in enumerate(zip(calls, sessions, strict=True)):
        if isinstance(session, workers.Session) and session.worker_id in active:
            slots = max(0, min(call.max_leases, free[session.worker_id]))
            free[session.worker_id] -= slots
            if slots:
                claimers.append(_Claimer(index, session, slots))
    return claimers


async def _grant_and_lease(
    conn: Conn, claimers: Sequence[_Claimer], lease_ttl_ms: int, events: EventBatch
) -> None:
    """Slots still empty once the pending dispatches are gone: ready tasks are granted
    here, by the one grant rule, and leased in this same transaction (ready -> queued ->
    running), instead of waiting for the coordinator's next pass and its notification.

    Only when no offer served the batch at all: a worker that waits (idle, or between
    two hops of a chain). Under load the pass grants in larger batches, ahead of the
    slots (prefetch); topping up each short Claim with a grant of its own instead put
    more, smaller dispatch creations under the run locks that claims and results need
    (measured: single_run 4x8 lost about a sixth of its rate)."""
    short = [claimer for claimer in claimers if claimer.missing > 0]
    if not short or any(claimer.issued for claimer in claimers):
        return
    missing: Counter[str] = Counter()
    for claimer in short:
        for kind in claimer.kinds:
            missing[kind] += claimer.missing
    granted = await dispatching.grant_for_claims(
        conn, dict(missing), sum(claimer.missing for claimer in short), events
    )
    if not granted.created:
        return
    before = sum(len(claimer.issued) for claimer in claimers)
    # From the runs the grant locked: the offers just created, and any older ones there.
    await _lease_round(conn, claimers, lease_ttl_ms, events, runs=granted.runs)
    if sum(len(claimer.issued) for claimer in claimers) - before < granted.created:
        # Some went to no slot (older offers of busy runs came first): others may take them.
        for kind in sorted(missing):
            events.notify(DISPATCH_CHANNEL, kind)


async def _lease_round(
    conn: Conn,
    claimers: Sequence[_Claimer],
    lease_ttl_ms: int,
    events: EventBatch,
    *,
    skip_locked: bool = True,
    runs: Sequence[locks.ClaimableRun] | None = None,
) -> bool:
    """Locks the runs of the oldest pending dispatches the short claimers can run (or
    takes `runs`, which this transaction holds already) and leases them out; False when
    nothing is left to do (every claimer served, or no claimable run)."""
    short = [claimer for claimer in claimers if claimer.missing > 0]
    if not short:
        return False
    kinds = sorted({kind for claimer in short for kind in claimer.kinds})
    if runs is None:
        runs = await locks.claimable_runs(
            conn,
            kinds,
            sum(claimer.missing for claimer in short),
            skip_locked=skip_locked,
            labels={label for claimer in short for label in claimer.session.labels},
            resources={name for claimer in short for name in claimer.session.capacity},
        )
    if not runs:
        return False
    run_ids = [run.id for run in runs]
    # Runs with a dispatch to place (placement.match) first, for the claimers that fit
    # it; then every slot still empty takes dispatches without placement.
    placed_runs = [run.id for run in runs if run.placed]
    # One statement serves the short claimers of one set of kinds, first come first
    # served; the sets take turns in the order their first claimer came.
    by_kinds: dict[tuple[str, ...], list[_Claimer]] = {}
    for claimer in claimers:
        by_kinds.setdefault(claimer.kinds, [])
        if claimer.missing > 0:
            by_kinds[claimer.kinds].append(claimer)
    for group_kinds, group in by_kinds.items():
        if group and placed_runs:
            chosen = await placement.match(conn, group, group_kinds, placed_runs)
            if chosen:
                await _take(conn, chosen, group_kinds, placed_runs, lease_ttl_ms, events)
        slots = [(claimer, None) for claimer in group for _ in range(claimer.missing)]
        if slots:
            await _take(conn, slots, group_kinds, run_ids, lease_ttl_ms, events)
    return True


async def _take(
    conn: Conn,
    offered: Sequence[tuple[_Claimer, int | None]],
    kinds: Sequence[str],
    run_ids: Sequence[UUID],
    lease_ttl_ms: int,
    events: EventBatch,
) -> None:
    """Leases dispatches of these (locked) runs to the slots offered, in order: each
    slot's claimer and the placed dispatch chosen for it (placement.match), or None for
    slots that take the oldest dispatches without placement."""
    slots = [claimer for claimer, _ in offered]
    chosen = [dispatch for _, dispatch in offered if dispatch is not None]
    secrets = [tokens.new_token() for _ in slots]
    rows = await conn.fetch(
        *named(
            Q["take"],
            slot_workers=[claimer.session.worker_id for claimer in slots],
            kinds=list(kinds),
            run_ids=run_ids,
            slots=len(slots),
            chosen=chosen or None,
            token_digests=[tokens.digest(secret) for secret in secrets],
            lease_ttl_ms=lease_ttl_ms,
            max_input_bytes=MAX_CLAIM_INPUT_JSON_BYTES,
            max_inline_output_bytes=MAX_INLINE_OUTPUT_JSON_BYTES,
        )
    )
    for row in rows:
        slot = row["token_index"] - 1
        slots[slot].issued.append(_issued(row, secrets[slot]))
        _record_start(events, row)


def _issued(row: asyncpg.Record, lease_token: str) -> IssuedLease:
    upstream: dict[str, dict[str, Any]] = row["upstream_outputs"] or {}
    return IssuedLease(
        dispatch_id=row["dispatch_id"],
        lease_token=lease_token,
        fencing_token=row["fencing_token"],
        run_id=row["run_id"],
        task_key=row["task_key"],
        executor_kind=row["executor_kind"],
        action=row["action"],
        input=row["input"],
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        lease_expires_at=row["lease_expires_at"],
        lease_remaining_ms=float(row["lease_remaining_ms"]),
        attempt_deadline=row["attempt_deadline"],
        attempt_remaining_ms=float(row["attempt_remaining_ms"]),
        run_input=row["run_input"],
        upstream_outputs=upstream,
        omitted_upstream_keys=tuple(key for key in row["depends_on"] if key not in upstream),
        upstream_states=row["upstream_states"] or {},
        trace=TraceRef(row["trace_id"], row["trace_span"]) if row["trace_id"] else None,
        ready_at=row["ready_at"],
        leased_at=row["leased_at"],
    )


def _record_start(events: EventBatch, row: asyncpg.Record) -> None:
    events.task(row["run_id"], row["task_key"], "queued", "running", row["attempt"])
    events.attempt(
        row["run_id"],
        row["task_key"],
        row["attempt"],
        None,
        "running",
        {
            "worker_id": str(row["worker_id"]),
            "dispatch_id": row["dispatch_id"],
            "fencing_token": row["fencing_token"],
        },
    )
