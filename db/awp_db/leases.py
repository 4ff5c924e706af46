"""Leases: claim, heartbeat renewal, fenced completion, hand-back and stream loss.

Lock order everywhere: worker row, then run rows (ascending), then dispatch rows.
Every time comes from the database clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import asyncpg

from awp_db import settle, workers
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.queries import queries
from awp_kernel import errors, tokens
from awp_kernel.fencing import ResultVerdict, judge_result
from awp_kernel.results import result_hash

Q = queries("leases")
log = logging.getLogger("awp.db.leases")

# Listeners of this channel (servers parking long-poll claims) hear of new dispatches.
DISPATCH_CHANNEL = "awp_dispatch"


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
    upstream_outputs: dict[str, dict[str, Any]]


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


@dataclass(frozen=True, slots=True)
class ResultIn:
    dispatch_id: int
    lease_token: str
    outcome: Literal["succeeded", "failed"]
    output: dict[str, Any] | None = None
    error_message: str | None = None
    retryable: bool = True

    def digest(self) -> bytes:
        return result_hash(self.outcome, self.output, self.error_message, self.retryable)


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    state: str
    active_leases: int
    handed_back: int


@dataclass(frozen=True, slots=True)
class ClaimCall:
    """One Claim call: a session asking for up to max_leases leases."""

    worker_id: str
    session_token: str
    max_leases: int


async def claim(
    conn: Conn,
    worker_id: str,
    session_token: str,
    max_leases: int,
    lease_ttl_ms: int,
) -> list[IssuedLease]:
    """Leases up to max_leases dispatches, never more than the session's free slots."""
    (outcome,) = await claim_many(
        conn, [ClaimCall(worker_id, session_token, max_leases)], lease_ttl_ms
    )
    if isinstance(outcome, errors.AwpError):
        raise outcome
    return outcome


class ClaimAbandoned(Exception):
    """A caller went away before its leases were committed: everything was rolled back."""


async def claim_many(
    conn: Conn,
    calls: Sequence[ClaimCall],
    lease_ttl_ms: int,
    *,
    still_wanted: Callable[[int], bool] | None = None,
) -> list[list[IssuedLease] | errors.AwpError]:
    """Several Claim calls (possibly of different sessions) in one transaction.

    Lock order as for one: the sessions' worker rows (ascending id), then the runs
    (ascending), then the dispatches. Each call gets at most its session's free slots,
    counted after its row is locked (two calls of one session share them); earlier
    calls are served first. A call whose session is invalid or draining gets its error
    back (returned, not raised) and nothing else changes for it.

    still_wanted(i), asked just before commit, tells whether call i's caller still
    waits; if one that was issued leases does not, the transaction is rolled back
    and ClaimAbandoned raised, so no lease is ever committed for nobody.
    """
    events = EventBatch()
    outcomes: list[list[IssuedLease] | errors.AwpError] = []
    async with conn.transaction():
        sessions = await workers.authenticate_many(
            conn, [(call.worker_id, call.session_token) for call in calls], for_update=True
        )
        live = {
            s.worker_id: s
            for s in sessions
            if isinstance(s, workers.Session) and s.state == "active"
        }
        free: dict[UUID, int] = {}
        if live:
            held = await workers.active_lease_counts(conn, list(live))
            free = {worker: live[worker].max_concurrency - held[worker] for worker in live}
        # Slots offered per call, grouped by kinds (one take serves one set of kinds).
        wants: list[int] = []
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, (call, session) in enumerate(zip(calls, sessions, strict=True)):
            want = 0
            if isinstance(session, workers.Session) and session.worker_id in live:
                want = max(0, min(call.max_leases, free[session.worker_id]))
                free[session.worker_id] -= want
                if want:
                    groups.setdefault(tuple(sorted(session.executor_kinds)), []).append(index)
            wants.append(want)
        issued: dict[int, list[IssuedLease]] = {}
        # First the runs of the oldest pending dispatches, waited for in ascending id.
        # Concurrent claims may have taken some of those meanwhile: a short batch then
        # adds whatever other runs are free right now (SKIP LOCKED never waits, so the
        # lock order cannot be violated) rather than answering with slots left empty.
        for query in (Q["claimable_runs"], Q["claimable_runs"] + " SKIP LOCKED"):
            missing = [want - len(issued.get(index, ())) for index, want in enumerate(wants)]
            if sum(missing) <= 0:
                break
            groups = {
                group: [index for index in members if missing[index] > 0]
                for group, members in groups.items()
            }
            kinds = sorted({kind for group, members in groups.items() if members for kind in group})
            run_ids = [row["id"] for row in await conn.fetch(query, kinds, sum(missing))]
            if not run_ids:
                break
            for group_kinds, members in groups.items():
                owners = [index for index in members for _ in range(missing[index])]
                if not owners:
                    continue
                secrets_ = [tokens.new_token() for _ in owners]
                rows = await conn.fetch(
                    Q["take"],
                    [_live_worker(sessions[index]) for index in owners],
                    list(group_kinds),
                    run_ids,
                    len(owners),
                    [tokens.digest(token) for token in secrets_],
                    lease_ttl_ms,
                )
                for row in rows:
                    slot = row["token_index"] - 1
                    issued.setdefault(owners[slot], []).append(_issued(row, secrets_[slot]))
                    _record_start(events, row)
        for index, session in enumerate(sessions):
            if not isinstance(session, workers.Session):
                outcomes.append(session)
            elif session.state != "active":
                outcomes.append(errors.worker_draining())
            else:
                outcomes.append(issued.get(index, []))
        if still_wanted is not None and any(not still_wanted(index) for index in issued):
            raise ClaimAbandoned()
        await events.flush(conn)
    return outcomes


def _live_worker(session: workers.Session | errors.AwpError) -> UUID:
    assert isinstance(session, workers.Session)
    return session.worker_id


def _issued(row: asyncpg.Record, lease_token: str) -> IssuedLease:
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
        upstream_outputs=row["upstream_outputs"] or {},
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


async def renew(
    conn: Conn, worker_id: UUID, leases: Sequence[LeaseRef], lease_ttl_ms: int
) -> list[LeaseAnswer]:
    """Answers each lease a heartbeat lists: RENEWED, REVOKED or UNKNOWN."""
    if not leases:
        return []
    rows = {
        row["id"]: row
        for row in await conn.fetch(Q["lease_digests"], [lease.dispatch_id for lease in leases])
    }
    owned = [
        lease.dispatch_id
        for lease in leases
        if (row := rows.get(lease.dispatch_id)) is not None
        and row["worker_id"] == worker_id
        and tokens.matches(lease.lease_token, row["lease_token_hash"])
    ]
    renewed = {
        row["id"]: row for row in await conn.fetch(Q["renew"], worker_id, owned, lease_ttl_ms)
    }
    answers = []
    owned_set = set(owned)
    for lease in leases:
        if (row := renewed.get(lease.dispatch_id)) is not None:
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


async def complete(
    conn: Conn, worker_id: str, session_token: str, results: Sequence[ResultIn]
) -> list[ResultVerdict]:
    """Writes the results whose lease is still valid; one verdict per result, in order."""
    (outcome,) = await complete_many(conn, [Completion(worker_id, session_token, results)])
    if isinstance(outcome, errors.AwpError):
        raise outcome
    return outcome


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
    outcomes: list[list[ResultVerdict] | errors.AwpError] = []
    # Hashed before any lock is taken: the locks are held only for the judgement.
    digests = {result.dispatch_id: result.digest() for call in calls for result in call.results}
    async with conn.transaction():
        sessions = await workers.authenticate_many(
            conn, [(call.worker_id, call.session_token) for call in calls]
        )
        ids: list[int] = []
        seen: set[int] = set()
        for call, session in zip(calls, sessions, strict=True):
            if isinstance(session, workers.Session):
                mine = {result.dispatch_id for result in call.results}
                if mine & seen:
                    raise ValueError("a dispatch appears in two calls of one batch")
                seen |= mine
                ids.extend(result.dispatch_id for result in call.results)
        locked: dict[int, asyncpg.Record] = {}
        if ids:
            await conn.fetch(Q["lock_runs_of"], ids)
            locked = {row["id"]: row for row in await conn.fetch(Q["lock_for_settlement"], ids)}
        endings: list[settle.Ending] = []
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
                    holder_and_token_match=row["worker_id"] == session.worker_id
                    and tokens.matches(result.lease_token, row["lease_token_hash"]),
                    state=row["state"],
                    stored_result_hash=row["result_hash"],
                    result_hash=digest,
                    now=row["now"],
                    lease_expires_at=row["lease_expires_at"],
                    attempt_deadline=row["attempt_deadline"],
                )
                verdicts.append(verdict)
                if verdict is ResultVerdict.ACCEPTED:
                    error = (
                        {"message": result.error_message or "", "retryable": result.retryable}
                        if result.outcome == "failed"
                        else None
                    )
                    endings.append(
                        settle.ending_of(
                            row,
                            result.outcome,
                            output=result.output,
                            error=error,
                            retryable=result.retryable,
                            digest=digest,
                        )
                    )
            outcomes.append(verdicts)
        if endings:
            await settle.end_attempts(conn, endings, events)
            events.notify(settle.COORDINATOR_CHANNEL, "completed")
            await events.flush(conn)
    return outcomes


async def interrupt(
    conn: Conn,
    dispatch_ids: Sequence[int],
    reason: str,
    events: EventBatch,
    *,
    worker_id: UUID | None = None,
) -> int:
    """Settles leases at once as `interrupted` (hand-back, offline worker).

    The caller holds a transaction and the worker's row lock when worker_id is given;
    only leases still held (by that worker) are settled.
    """
    if not dispatch_ids:
        return 0
    await conn.fetch(Q["lock_runs_of"], list(dispatch_ids))
    endings = [
        settle.ending_of(row, "interrupted", error={"message": reason, "retryable": True})
        for row in await conn.fetch(Q["lock_for_settlement"], list(dispatch_ids))
        if row["state"] == "leased" and (worker_id is None or row["worker_id"] == worker_id)
    ]
    await settle.end_attempts(conn, endings, events)
    return len(endings)


async def drain(
    conn: Conn, worker_id: str, session_token: str, hand_back: Sequence[LeaseRef]
) -> DrainOutcome:
    """active -> draining; -> stopped once no lease remains (handed-back ones are settled)."""
    events = EventBatch()
    async with conn.transaction():
        session = await workers.authenticate(
            conn,
            worker_id,
            session_token,
            for_update=True,
            allowed_states=("active", "draining", "stopped"),
        )
        handed_back = 0
        if hand_back:
            rows = {
                row["id"]: row
                for row in await conn.fetch(Q["lease_digests"], [h.dispatch_id for h in hand_back])
            }
            valid = [
                h.dispatch_id
                for h in hand_back
                if (row := rows.get(h.dispatch_id)) is not None
                and row["worker_id"] == session.worker_id
                and tokens.matches(h.lease_token, row["lease_token_hash"])
            ]
            handed_back = await interrupt(
                conn, valid, "handed back by a draining worker", events, worker_id=session.worker_id
            )
        remaining = await workers.active_lease_count(conn, session.worker_id)
        state = session.state
        target = "stopped" if remaining == 0 else "draining"
        if state not in ("stopped", target):
            state = await workers.set_state(conn, session.worker_id, target)
        events.notify(settle.COORDINATOR_CHANNEL, "drain")
        await events.flush(conn)
    return DrainOutcome(state, remaining, handed_back)


async def stream_lost(conn: Conn, worker_id: UUID, epoch: int, grace_ms: int) -> int:
    """Shortens the worker's leases to the stream grace, unless a newer stream exists."""
    async with conn.transaction():
        current = await workers.lock_stream_epoch(conn, worker_id)
        if current != epoch:
            return 0
        shortened = await conn.fetch(Q["shorten"], worker_id, grace_ms)
        if shortened:
            # The coordinator sleeps until the earliest expiry it knows: tell it.
            await settle.notify_coordinator(conn, "stream_lost")
    return len(shortened)


async def worker_leases(conn: Conn, worker_ids: Sequence[UUID]) -> list[int]:
    return [row["id"] for row in await conn.fetch(Q["worker_leases"], list(worker_ids))]
