"""Leases once issued: heartbeat renewal, fenced completion, hand-back and stream loss.

Claiming them is awp_db.claims. Locks follow awp_db.locks; every time comes from the
database clock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from asyncpg import Record

from awp_db import locks, ratelimits, settle, workers
from awp_db.connect import Conn, Pool
from awp_db.events import EventBatch
from awp_db.queries import queries
from awp_db.signals import COORDINATOR_CHANNEL, RESULTS_ACCEPTED
from awp_kernel import errors
from awp_kernel.fencing import ResultVerdict, holds_lease, judge_result, lease_is_live
from awp_kernel.results import digest_of
from awp_protocol.results import CheckedResult, StoredError
from awp_protocol.states import HANDED_BACK

Q = queries("leases")
log = logging.getLogger("awp.db.leases")


@dataclass(frozen=True, slots=True)
class LeaseRef:
    dispatch_id: int
    lease_token: str


LeaseStatus = Literal["renewed", "revoked", "unknown"]


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    dispatch_id: int
    status: LeaseStatus
    lease_expires_at: datetime | None = None
    lease_remaining_ms: float = 0.0
    attempt_remaining_ms: float = 0.0


# A result as Complete reports it, checked: the protocol's one result type, taken as it is.
ResultIn = CheckedResult


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    state: str
    active_leases: int
    handed_back: int
    # Of those, the ones charged an attempt: their task had no free hand-back left.
    charged: int = 0


@dataclass(frozen=True, slots=True)
class LiveLease:
    """A lease its caller holds and may still use (live_lease)."""

    dispatch_id: int
    run_id: UUID
    task_key: str
    attempt: int
    fencing_token: int
    # The keys of the task's upstream tasks (whose outputs the holder may fetch).
    depends_on: list[str]


async def held(conn: Conn | Pool, worker_id: UUID, leases: Sequence[LeaseRef]) -> dict[int, Record]:
    """Those of the leases listed that worker_id holds (awp_kernel.fencing.holds_lease),
    in the order listed, by dispatch id, whether still live or not: an unlocked read (a
    dispatch's holder and token digest never change once leased)."""
    if not leases:
        return {}
    rows = {
        row["id"]: row
        for row in await conn.fetch(Q["lease_digests"], [lease.dispatch_id for lease in leases])
    }
    return {
        lease.dispatch_id: row
        for lease in leases
        if (row := rows.get(lease.dispatch_id)) is not None
        and holds_lease(worker_id, lease.lease_token, row["worker_id"], row["lease_token_hash"])
    }


async def live_lease(
    conn: Conn | Pool, worker_id: UUID, dispatch_id: int, lease_token: str
) -> LiveLease | None:
    """The lease if worker_id holds it with lease_token and it is live by the database
    clock now (awp_kernel.fencing: holds_lease and lease_is_live); None otherwise. An
    unlocked read: for a call that uses the lease without settling it (fetching upstream
    outputs, appending to a stream); what such a call writes must not depend on the
    lease staying live past this answer."""
    row = await conn.fetchrow(Q["live_lease"], dispatch_id)
    if (
        row is None
        or not holds_lease(worker_id, lease_token, row["worker_id"], row["lease_token_hash"])
        or not lease_is_live(
            row["state"], row["now"], row["lease_expires_at"], row["attempt_deadline"]
        )
    ):
        return None
    return LiveLease(
        dispatch_id,
        row["run_id"],
        row["task_key"],
        row["attempt"],
        row["fencing_token"],
        list(row["depends_on"]),
    )


async def renew(
    conn: Conn, worker_id: UUID, leases: Sequence[LeaseRef], lease_ttl_ms: int
) -> list[LeaseAnswer]:
    """Answers each lease a heartbeat lists: RENEWED, REVOKED or UNKNOWN.

    The server calls it outside a transaction, so no statement holds a lease while
    waiting for another (awp_db.locks): the free leases are renewed at once, then each
    busy one (a settlement or a cancel is deciding it) alone, once it is free.
    """
    if not leases:
        return []
    rows = await held(conn, worker_id, leases)
    owned = list(rows)
    locked = {
        row["id"]: row for row in await conn.fetch(Q["renew"], worker_id, owned, lease_ttl_ms)
    }
    for busy in [d for d in owned if d not in locked and rows[d]["state"] == "leased"]:
        async with conn.transaction():
            if await locks.lease(conn, busy, worker_id):
                locked.update(
                    (row["id"], row)
                    for row in await conn.fetch(Q["renew"], worker_id, [busy], lease_ttl_ms)
                )
    answers = []
    owned_set = set(owned)
    for lease in leases:
        row = locked.get(lease.dispatch_id)
        if row is not None and row["lease_expires_at"] is not None:
            answers.append(
                LeaseAnswer(
                    lease.dispatch_id,
                    "renewed",
                    row["lease_expires_at"],
                    float(row["lease_remaining_ms"]),
                    float(row["attempt_remaining_ms"]),
                )
            )
        elif lease.dispatch_id in owned_set:
            answers.append(LeaseAnswer(lease.dispatch_id, "revoked"))
        else:
            answers.append(LeaseAnswer(lease.dispatch_id, "unknown"))
    return answers


@dataclass(frozen=True, slots=True)
class Completion:
    """One Complete call: the results one session reports."""

    worker_id: str
    session_token: str
    results: Sequence[ResultIn]


async def complete_many(
    conn: Conn, calls: Sequence[Completion]
) -> list[list[ResultVerdict] | errors.AwpError]:
    """Several Complete calls (possibly of different sessions) in one transaction.

    Every result is judged exactly as on its own, against its own session; the
    transaction takes each run's lock once and bumps its revision once, however many
    calls touch it. A call whose session is invalid gets its error back (returned, not
    raised) and changes nothing. No dispatch may appear in two calls.
    """
    events = EventBatch()
    # Hashed before any lock is taken: the locks are held only for the judgement.
    digests = digests_of(calls)
    async with conn.transaction():
        sessions = await workers.authenticate_many(
            conn, [(call.worker_id, call.session_token) for call in calls]
        )
        outcomes = await settle_calls(conn, calls, sessions, digests, events)
        await events.flush(conn)
    return outcomes


def digests_of(calls: Sequence[Completion]) -> dict[int, bytes]:
    """The digest of every result of the calls, by dispatch (settle_calls)."""
    return {result.dispatch_id: digest_of(result) for call in calls for result in call.results}


async def settle_calls(
    conn: Conn,
    calls: Sequence[Completion],
    sessions: Sequence[workers.Session | errors.AwpError],
    digests: dict[int, bytes],
    events: EventBatch,
) -> list[list[ResultVerdict] | errors.AwpError]:
    """complete_many's work inside a transaction its caller holds, the calls' sessions
    authenticated (in the lock order, sessions before runs): each result judged and the
    accepted ones settled; the events go to the caller's batch, flushed by it."""
    outcomes: list[list[ResultVerdict] | errors.AwpError] = []
    ids: list[int] = []
    seen: set[int] = set()
    for call, session in zip(calls, sessions, strict=True):
        if isinstance(session, workers.Session):
            mine = {result.dispatch_id for result in call.results}
            if mine & seen:
                raise ValueError("a dispatch appears in two calls of one batch")
            seen |= mine
            ids.extend(result.dispatch_id for result in call.results)
    locked: dict[int, locks.LockedDispatch] = {}
    if ids:
        await locks.runs_of_dispatches(conn, ids)
        locked = {row.id: row for row in await locks.dispatches_for_settlement(conn, ids)}
    endings: list[settle.Ending] = []
    accepted: list[ResultIn] = []
    for call, session in zip(calls, sessions, strict=True):
        if not isinstance(session, workers.Session):
            outcomes.append(session)
            continue
        verdicts: list[ResultVerdict] = []
        for result in call.results:
            row = locked.get(result.dispatch_id)
            digest = digests[result.dispatch_id]
            if row is None:
                verdicts.append(ResultVerdict.LEASE_LOST)
                continue
            verdict = judge_result(
                holds=holds_lease(
                    session.worker_id, result.lease_token, row.worker_id, row.lease_token_hash
                ),
                state=row.state,
                stored_result_hash=row.result_hash,
                result_hash=digest,
                now=row.now,
                lease_expires_at=row.lease_expires_at,
                attempt_deadline=row.attempt_deadline,
            )
            verdicts.append(verdict)
            if verdict is ResultVerdict.ACCEPTED:
                accepted.append(result)
                endings.append(
                    settle.ending_of(
                        row,
                        result.outcome,
                        output=result.output,
                        error=result.error(),
                        digest=digest,
                        traceback=result.traceback,
                        log_tail=result.log_tail,
                        replayed=result.replayed,
                    )
                )
        outcomes.append(verdicts)
    if endings:
        # Only a fenced, accepted result reports usage or slows a limit down.
        await ratelimits.apply_reports(conn, accepted)
        await settle.end_attempts(conn, endings, events)
        events.notify(COORDINATOR_CHANNEL, RESULTS_ACCEPTED)
    return outcomes


async def interrupt(
    conn: Conn,
    dispatch_ids: Sequence[int],
    reason: str,
    events: EventBatch,
    *,
    worker_id: UUID | None = None,
) -> int:
    """Settles leases at once as `interrupted` (an offline worker's); returns how many.

    The caller holds a transaction and the worker's row lock when worker_id is given;
    only leases still held (by that worker) are settled.
    """
    count, _ = await _interrupt(conn, dispatch_ids, reason, events, worker_id, hand_back=False)
    return count


async def _interrupt(
    conn: Conn,
    dispatch_ids: Sequence[int],
    reason: str,
    events: EventBatch,
    worker_id: UUID | None,
    *,
    hand_back: bool,
) -> tuple[int, settle.Settled]:
    if not dispatch_ids:
        return 0, settle.Settled()
    await locks.runs_of_dispatches(conn, dispatch_ids)
    endings = [
        settle.ending_of(
            row, "interrupted", error=StoredError(reason, retryable=True), hand_back=hand_back
        )
        for row in await locks.dispatches_for_settlement(conn, dispatch_ids)
        if row.state == "leased" and (worker_id is None or row.worker_id == worker_id)
    ]
    return len(endings), await settle.end_attempts(conn, endings, events)


async def drain(
    conn: Conn, worker_id: str, session_token: str, hand_back: Sequence[LeaseRef]
) -> DrainOutcome:
    """active -> draining; -> stopped once no lease remains (handed-back ones are settled:
    free of charge while their task has free hand-backs left, awp_kernel.retry)."""
    events = EventBatch()
    async with conn.transaction():
        session = await workers.authenticate(
            conn,
            worker_id,
            session_token,
            for_update=True,
            allowed_states=("active", "draining", "stopped"),
        )
        handed_back = charged = 0
        if hand_back:
            valid = list(await held(conn, session.worker_id, hand_back))
            handed_back, settled = await _interrupt(
                conn,
                valid,
                HANDED_BACK,
                events,
                session.worker_id,
                hand_back=True,
            )
            charged = handed_back - settled.tasks_handed_back_free
        remaining = await workers.active_lease_count(conn, session.worker_id)
        state = session.state
        target = "stopped" if remaining == 0 else "draining"
        if state not in ("stopped", target):
            state = await workers.set_state(conn, session.worker_id, target)
        events.notify(COORDINATOR_CHANNEL, "drain")
        await events.flush(conn)
    return DrainOutcome(state, remaining, handed_back, charged)


async def stream_lost(conn: Conn, worker_id: UUID, epoch: int, grace_ms: int) -> int:
    """Shortens the worker's leases to the stream grace, unless a newer stream exists.

    As a renewal, it never waits for one lease while holding another (awp_db.locks): the
    free leases are shortened in one transaction, then each busy one in a transaction of
    its own, once it is free (and if it is still this worker's lease).
    """
    shortened, busy = await _shorten(conn, worker_id, epoch, grace_ms, None)
    for dispatch_id in busy:
        shortened += (await _shorten(conn, worker_id, epoch, grace_ms, dispatch_id))[0]
    return shortened


async def _shorten(
    conn: Conn, worker_id: UUID, epoch: int, grace_ms: int, busy: int | None
) -> tuple[int, list[int]]:
    """Shortens the free leases (or waits for the busy one given): how many, and which
    ones were busy."""
    async with conn.transaction():
        session = await locks.session(conn, worker_id)
        if session is None or session.stream_epoch != epoch:
            return 0, []
        if busy is not None and not await locks.lease(conn, busy, worker_id):
            return 0, []
        held = await worker_leases(conn, [worker_id]) if busy is None else [busy]
        shortened = [
            row["id"]
            for row in await conn.fetch(
                Q["shorten"], worker_id, None if busy is None else [busy], grace_ms
            )
        ]
        if shortened:
            # The coordinator sleeps until the earliest expiry it knows: tell it.
            await settle.notify_coordinator(conn, "stream_lost")
    return len(shortened), sorted(set(held) - set(shortened))


async def worker_leases(conn: Conn, worker_ids: Sequence[UUID]) -> list[int]:
    return [row["id"] for row in await conn.fetch(Q["worker_leases"], list(worker_ids))]
