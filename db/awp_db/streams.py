"""Output streams: fenced appends of an attempt's chunks, and their reads (DESIGN.md §15).

An append is judged by the lease rule (awp_kernel.fencing.judge_append) under its
dispatch's row lock, the lock the reaper, renewals and settlement take too: an attempt's
chunks are all committed before its lease can end, so once attempt N+1 exists attempt
N's chunks are frozen and positions can continue after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from awp_db import workers
from awp_db.connect import Conn, Pool
from awp_db.queries import queries, rows_as
from awp_db.signals import STREAM_CHANNEL
from awp_kernel import errors
from awp_kernel.fencing import ResultVerdict, holds_lease, judge_append
from awp_protocol.errors import Reason
from awp_protocol.limits import MAX_STREAM_BYTES_PER_ATTEMPT

Q = queries("streams")


@dataclass(frozen=True, slots=True)
class ChunkIn:
    data: str
    is_json: bool


@dataclass(frozen=True, slots=True)
class Appended:
    # ACCEPTED (something new stored), DUPLICATE (every chunk was stored already),
    # RESULT_CONFLICT (another chunk is stored at one of the offsets) or LEASE_LOST.
    verdict: ResultVerdict
    # The offset the attempt's next chunk must have.
    next_offset: int


@dataclass(frozen=True, slots=True)
class StreamTask:
    id: int
    state: str


@dataclass(frozen=True, slots=True)
class AttemptMark:
    attempt: int
    state: str
    ended: bool
    error_message: str | None


@dataclass(frozen=True, slots=True)
class Chunk:
    position: int
    attempt: int
    chunk_offset: int
    data: str
    is_json: bool


def stream_limit(message: str) -> errors.AwpError:
    return errors.AwpError(errors.ErrorKind.RESOURCE_EXHAUSTED, Reason.STREAM_LIMIT, message)


async def append(
    conn: Conn,
    worker_id: str,
    session_token: str,
    dispatch_id: int,
    lease_token: str,
    first_offset: int,
    chunks: Sequence[ChunkIn],
) -> Appended:
    """Stores chunks first_offset.. of the lease's attempt, if the lease is live.

    A resend of stored chunks is a DUPLICATE (the new tail, if any, is stored); a chunk
    different from the one stored at its offset is a RESULT_CONFLICT and nothing is
    stored; a batch starting past the next offset is refused (no gaps)."""
    async with conn.transaction():
        session = await workers.authenticate(conn, worker_id, session_token)
        row = await conn.fetchrow(Q["lock_lease"], dispatch_id)
        verdict = ResultVerdict.LEASE_LOST
        if row is not None:
            verdict = judge_append(
                holds=holds_lease(
                    session.worker_id, lease_token, row["worker_id"], row["lease_token_hash"]
                ),
                state=row["state"],
                now=row["now"],
                lease_expires_at=row["lease_expires_at"],
                attempt_deadline=row["attempt_deadline"],
            )
        if row is None or verdict is not ResultVerdict.ACCEPTED:
            return Appended(ResultVerdict.LEASE_LOST, 0)
        tail = await conn.fetchrow(Q["tail"], dispatch_id)
        next_offset, written = (0, 0) if tail is None else (tail[0] + 1, tail[1])
        if first_offset > next_offset:
            raise errors.invalid(
                "first_offset",
                f"is {first_offset}, past the attempt's next offset {next_offset} (no gaps)",
            )
        overlap = min(first_offset + len(chunks), next_offset)
        for stored in await conn.fetch(Q["stored"], dispatch_id, first_offset, overlap):
            chunk = chunks[stored["chunk_offset"] - first_offset]
            if (stored["data"], stored["is_json"]) != (chunk.data, chunk.is_json):
                return Appended(ResultVerdict.RESULT_CONFLICT, next_offset)
        fresh = chunks[overlap - first_offset :]
        if not fresh:
            return Appended(ResultVerdict.DUPLICATE, next_offset)
        totals: list[int] = []
        for chunk in fresh:
            written += len(chunk.data.encode())
            totals.append(written)
        if written > MAX_STREAM_BYTES_PER_ATTEMPT:
            raise stream_limit(
                f"the attempt's stream would be {written} bytes, more than the "
                f"{MAX_STREAM_BYTES_PER_ATTEMPT} allowed per attempt"
            )
        base = await conn.fetchval(Q["base"], dispatch_id, row["task_id"])
        await conn.execute(
            Q["insert"],
            dispatch_id,
            row["run_id"],
            row["task_id"],
            row["attempt"],
            base,
            list(range(overlap, overlap + len(fresh))),
            [chunk.data for chunk in fresh],
            [chunk.is_json for chunk in fresh],
            totals,
        )
        await conn.execute(Q["notify"], STREAM_CHANNEL, str(row["task_id"]))
    return Appended(ResultVerdict.ACCEPTED, overlap + len(fresh))


async def task(conn: Conn | Pool, run_id: UUID, task_key: str) -> StreamTask | None:
    row = await conn.fetchrow(Q["task"], run_id, task_key)
    return None if row is None else StreamTask(row["id"], row["state"])


async def attempts(conn: Conn | Pool, task_id: int) -> list[AttemptMark]:
    return await rows_as(AttemptMark, conn, Q["attempts"], task_id)


async def chunks(conn: Conn | Pool, task_id: int, position: int, limit: int) -> list[Chunk]:
    return await rows_as(Chunk, conn, Q["chunks"], task_id, position, limit)


async def attempt_at(conn: Conn | Pool, task_id: int, position: int) -> int | None:
    """The attempt that wrote the chunk at position (None if none is stored there)."""
    value = await conn.fetchval(Q["attempt_at"], task_id, position)
    return None if value is None else int(value)
