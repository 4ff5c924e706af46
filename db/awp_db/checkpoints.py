"""Step checkpoints (docs/design.md §16): memos of a task, stored under the lease of the
attempt that ran the step, read back by every later attempt.

A memo's write is fenced exactly as a result's: the lease rule (awp_kernel.fencing:
holds_lease, and the lease live on the database clock) judged under the dispatch's row
lock (awp_db.locks.lease_for_memo), the lock settlement and the reaper take too, so no
memo is stored once its attempt may have ended, and a stale attempt's write is
LEASE_LOST. A stored memo never changes: the same value again is a DUPLICATE, another
one a RESULT_CONFLICT (nothing written). The reads (LoadCheckpoints) are fenced by the
same rule, unlocked, as upstream outputs are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from awp_db import leases, locks
from awp_db.connect import Conn, Pool
from awp_db.outputs import lease_lost
from awp_db.queries import named, queries, row_as, rows_as
from awp_kernel import errors
from awp_kernel.fencing import ResultVerdict, holds_lease, judge_append
from awp_protocol.errors import Reason
from awp_protocol.limits import MAX_MEMO_BYTES_PER_TASK, MAX_MEMOS_PER_TASK

Q = queries("checkpoints")


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    kind: str
    name: str
    occurrence: int
    value_json: str
    tokens: int
    cost_usd: float
    timed_out: bool
    # The attempt that stored it; 0 for a wait's outcome stored while no attempt ran.
    attempt: int
    # How many checkpoints follow the page's start key (load_page: more than the page
    # holds means another page).
    available: int


@dataclass(frozen=True, slots=True)
class StepMemo:
    name: str
    occurrence: int
    # The value as canonical JSON, and its size in UTF-8 bytes (at most MAX_MEMO_BYTES:
    # the caller checked).
    value_json: str
    value_bytes: int
    tokens: int
    cost_usd: float


@dataclass(frozen=True, slots=True)
class _Totals:
    memos: int
    bytes: int


def memo_limit(message: str) -> errors.AwpError:
    return errors.AwpError(errors.ErrorKind.RESOURCE_EXHAUSTED, Reason.MEMO_LIMIT, message)


async def load_page(
    conn: Conn | Pool,
    worker_id: UUID,
    dispatch_id: int,
    lease_token: str,
    after: tuple[str, str, int] | None,
    budget_bytes: int,
) -> list[StoredCheckpoint]:
    """The lease's task's checkpoints after the key ``after`` (None: from the first), in
    (kind, name, occurrence) order, adding up to budget_bytes of values (at least one),
    for the live holder of the lease only; LEASE_LOST otherwise."""
    lease = await leases.live_lease(conn, worker_id, dispatch_id, lease_token)
    if lease is None:
        raise lease_lost()
    task_id = await conn.fetchval(Q["task_of_lease"], dispatch_id)
    kind, name, occurrence = after if after is not None else (None, None, None)
    return await rows_as(
        StoredCheckpoint, conn, Q["page"], task_id, kind, name, occurrence, budget_bytes
    )


async def record_step(
    conn: Conn, worker_id: UUID, dispatch_id: int, lease_token: str, memo: StepMemo
) -> ResultVerdict:
    """Stores the memo for the lease's task if the lease is live: ACCEPTED, DUPLICATE
    (this value is stored already), RESULT_CONFLICT (another is) or LEASE_LOST; MEMO_LIMIT
    past the memos (count or bytes) one task may store."""
    async with conn.transaction():
        row = await locks.lease_for_memo(conn, dispatch_id)
        if (
            row is None
            or judge_append(
                holds=holds_lease(worker_id, lease_token, row.worker_id, row.lease_token_hash),
                state=row.state,
                now=row.now,
                lease_expires_at=row.lease_expires_at,
                attempt_deadline=row.attempt_deadline,
            )
            is not ResultVerdict.ACCEPTED
        ):
            return ResultVerdict.LEASE_LOST
        same = await conn.fetchval(
            Q["stored"], row.task_id, "step", memo.name, memo.occurrence, memo.value_json
        )
        if same is not None:
            return ResultVerdict.DUPLICATE if same else ResultVerdict.RESULT_CONFLICT
        totals = await row_as(_Totals, conn, Q["totals"], row.task_id)
        assert totals is not None  # an aggregate always answers
        if totals.memos >= MAX_MEMOS_PER_TASK:
            raise memo_limit(
                f"step {memo.name!r}: the task stores {totals.memos} memos already, the most "
                f"one task may (the memos-per-task limit, {MAX_MEMOS_PER_TASK})"
            )
        if totals.bytes + memo.value_bytes > MAX_MEMO_BYTES_PER_TASK:
            raise memo_limit(
                f"step {memo.name!r}: its {memo.value_bytes} bytes would bring the task's "
                f"memos to {totals.bytes + memo.value_bytes} bytes, more than the "
                f"{MAX_MEMO_BYTES_PER_TASK} one task may store (the memo bytes-per-task limit)"
            )
        await conn.execute(
            *named(
                Q["insert_step"],
                task_id=row.task_id,
                run_id=row.run_id,
                name=memo.name,
                occurrence=memo.occurrence,
                value=memo.value_json,
                value_bytes=memo.value_bytes,
                tokens=memo.tokens,
                cost_usd=memo.cost_usd,
                dispatch_id=row.id,
                attempt=row.attempt,
                fencing_token=row.fencing_token,
            )
        )
        return ResultVerdict.ACCEPTED


def next_page(page: Sequence[StoredCheckpoint]) -> tuple[str, str, int] | None:
    """The key the next page starts after (the page's last), None after the last page."""
    if not page or page[0].available <= len(page):
        return None
    last = page[-1]
    return (last.kind, last.name, last.occurrence)


async def store_wait_outcome(
    conn: Conn,
    task_id: int,
    run_id: UUID,
    kind: str,
    name: str,
    occurrence: int,
    value_json: str,
    *,
    timed_out: bool = False,
    dispatch_id: int | None = None,
    attempt: int | None = None,
) -> StoredCheckpoint:
    """Stores a satisfied (or timed-out) wait's outcome, by the attempt that reached it
    or (no attempt running) by none; under the run's lock (awp_db.waits)."""
    stored = await row_as(
        StoredCheckpoint,
        conn,
        *named(
            Q["insert_wait_outcome"],
            task_id=task_id,
            run_id=run_id,
            kind=kind,
            name=name,
            occurrence=occurrence,
            value=value_json,
            timed_out=timed_out,
            dispatch_id=dispatch_id,
            attempt=attempt,
        ),
    )
    assert stored is not None  # an INSERT ... RETURNING answers its row
    return stored
