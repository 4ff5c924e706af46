"""Worker sessions: registration, authentication, heartbeats, drain, offline detection,
and the servers' own liveness, which offline detection counts silence against."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from awp_db import locks
from awp_db.connect import Conn, Pool
from awp_db.locks import SessionRow
from awp_db.queries import named, queries, row_as, rows_as
from awp_db.signals import COORDINATOR_CHANNEL
from awp_kernel import errors, tokens
from awp_protocol.placement import worker_labels

Q = queries("workers")
log = logging.getLogger("awp.db.workers")

LIVE_STATES = ("active", "draining")


@dataclass(frozen=True, slots=True)
class Registration:
    worker_id: UUID
    session_token: str
    registered_at: datetime


@dataclass(frozen=True, slots=True)
class OfflineRule:
    """A live session is offline once silent for `intervals` of its own heartbeat
    interval (the one its server gave it at Register) and for at least `floor_ms`,
    silence counting only from when a server could record its heartbeat
    (heartbeat_silence_from(), migration 0005)."""

    intervals: int
    floor_ms: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    worker_id: UUID
    state: str
    executor_kinds: list[str]
    max_concurrency: int
    # Its placement labels and each resource's capacity (migration 0020).
    labels: frozenset[str] = frozenset()
    capacity: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A session as operators list it (ListWorkers)."""

    id: UUID
    name: str
    state: str
    executor_kinds: list[str]
    max_concurrency: int
    labels: dict[str, str]
    protocol_version: int
    registered_at: datetime
    last_heartbeat_at: datetime
    stopped_at: datetime | None
    active_leases: int
    models: list[str]
    resource_names: list[str]
    resource_units: list[int]
    resource_reserved: list[int]


def parse_worker_id(worker_id: str) -> UUID:
    try:
        return UUID(worker_id)
    except ValueError:
        raise errors.session_invalid() from None


async def register(
    conn: Conn | Pool,
    name: str,
    protocol_version: int,
    executor_kinds: list[str],
    max_concurrency: int,
    labels: dict[str, str],
    *,
    heartbeat_interval_ms: int,
    models: Sequence[str] = (),
    resources: Mapping[str, int] | None = None,
) -> Registration:
    """A new session. Its placement labels are its labels and models
    (awp_protocol.placement.worker_labels); `resources`: each one's capacity."""
    token = tokens.new_token()
    capacity = sorted((resources or {}).items())
    row = await conn.fetchrow(
        *named(
            Q["register"],
            name=name,
            protocol_version=protocol_version,
            executor_kinds=executor_kinds,
            max_concurrency=max_concurrency,
            labels=labels,
            session_token_hash=tokens.digest(token),
            heartbeat_interval_ms=heartbeat_interval_ms,
            channel=COORDINATOR_CHANNEL,
            models=sorted(set(models)),
            placement_labels=list(worker_labels(labels, models)),
            resource_names=[name for name, _ in capacity],
            resource_units=[units for _, units in capacity],
        )
    )
    assert row is not None
    return Registration(row["id"], token, row["registered_at"])


async def authenticate(
    conn: Conn,
    worker_id: str,
    session_token: str,
    *,
    for_update: bool = False,
    allowed_states: tuple[str, ...] = LIVE_STATES,
) -> Session:
    """The live session these credentials prove, or SESSION_INVALID; for_update locks
    its row (see awp_db.locks for the lock order)."""
    wid = parse_worker_id(worker_id)
    if for_update:
        row = await locks.session(conn, wid)
    else:
        row = await row_as(SessionRow, conn, Q["session"], wid)
    return _session(row, wid, worker_id, session_token, allowed_states)


async def authenticate_many(
    conn: Conn, credentials: Sequence[tuple[str, str]], *, for_update: bool = False
) -> list[Session | errors.AwpError]:
    """Several (worker_id, session_token) pairs in one read: each the live session it
    proves, or its SESSION_INVALID error (returned, not raised). for_update locks the
    rows (see awp_db.locks for the lock order)."""
    found: list[Session | errors.AwpError] = []
    ids: dict[str, UUID] = {}
    for worker_id, _ in credentials:
        with contextlib.suppress(errors.AwpError):
            ids[worker_id] = parse_worker_id(worker_id)
    wanted = sorted(set(ids.values()))
    if for_update:
        found_rows = await locks.sessions(conn, wanted)
    else:
        found_rows = await rows_as(SessionRow, conn, Q["sessions"], wanted)
    rows = {row.id: row for row in found_rows}
    for worker_id, session_token in credentials:
        wid = ids.get(worker_id)
        if wid is None:
            found.append(errors.session_invalid())
            continue
        try:
            found.append(_session(rows.get(wid), wid, worker_id, session_token, LIVE_STATES))
        except errors.AwpError as exc:
            found.append(exc)
    return found


def _session(
    row: SessionRow | None,
    wid: UUID,
    worker_id: str,
    session_token: str,
    allowed_states: tuple[str, ...],
) -> Session:
    if row is None or not tokens.matches(session_token, row.session_token_hash):
        log.info("session rejected", extra={"worker_id": worker_id, "why": "unknown or bad token"})
        raise errors.session_invalid()
    if row.state not in allowed_states:
        log.info("session rejected", extra={"worker_id": worker_id, "why": row.state})
        raise errors.session_invalid(f"worker session is {row.state}: register anew")
    return Session(
        wid,
        row.state,
        list(row.executor_kinds),
        row.max_concurrency,
        frozenset(row.placement_labels),
        dict(zip(row.resource_names, row.resource_units, strict=True)),
    )


async def active_lease_counts(conn: Conn, worker_ids: Sequence[UUID]) -> dict[UUID, int]:
    """Leases each worker holds (0 for none)."""
    counts = dict.fromkeys(worker_ids, 0)
    for row in await conn.fetch(Q["active_leases_of"], list(set(worker_ids))):
        counts[row["worker_id"]] = row["n"]
    return counts


async def active_lease_count(conn: Conn, worker_id: UUID) -> int:
    count: int = await conn.fetchval(Q["active_leases"], worker_id)
    return count


async def touch(conn: Conn, worker_ids: Sequence[UUID]) -> dict[UUID, str]:
    """Records a heartbeat of each session; the state of each one still live (the
    others, no longer live, are left out)."""
    return {row["id"]: row["state"] for row in await conn.fetch(Q["touch"], list(worker_ids))}


async def open_stream(conn: Conn, worker_id: UUID) -> int | None:
    epoch: int | None = await conn.fetchval(Q["open_stream"], worker_id)
    return epoch


async def set_state(conn: Conn, worker_id: UUID, state: str) -> str:
    new_state: str = await conn.fetchval(Q["set_state"], worker_id, state)
    return new_state


async def mark_offline(conn: Conn, worker_ids: list[UUID]) -> list[UUID]:
    rows = await conn.fetch(Q["mark_offline"], worker_ids)
    return [row["id"] for row in rows]


# A server is live until it misses this many of its liveness writes (DESIGN.md §7).
SERVER_STALE_AFTER_WRITES = 2


async def record_liveness(conn: Conn | Pool, server_id: UUID, every_ms: int) -> datetime:
    """Records that server_id serves now, writing every `every_ms`; returns the start of
    its current unbroken stretch (heartbeat_silence_from() counts silence from these)."""
    since: datetime = await conn.fetchval(
        Q["record_liveness"], server_id, SERVER_STALE_AFTER_WRITES * every_ms
    )
    return since


async def list_workers(conn: Conn | Pool, include_inactive: bool) -> list[WorkerInfo]:
    return await rows_as(WorkerInfo, conn, Q["list"], include_inactive)
