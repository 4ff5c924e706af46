"""The lease rule: whether a worker holds a lease, and whether a reported result may be
written (DESIGN.md §4).

A lease is valid iff its session is live (checked by the caller), the dispatch is
`leased` to this worker, the token's digest matches, and the database clock is before
both the lease expiry and the attempt deadline. A repeat of an accepted result is a
DUPLICATE; a different result for the same lease a RESULT_CONFLICT.

Ownership (holds_lease) and liveness (lease_is_live) are judged here, in Python, and
only here: storage reads a lease's holder, token digest, state, times and the database
clock in one query and asks these functions (awp_db.leases.held, .live_lease, and
complete_many on its locked rows). The statements that write a lease (renew, shorten,
reap) restate the same conditions in their WHERE clause, for there the condition must
be read under the row lock the write takes (awp_db.locks).
"""

from __future__ import annotations

import hmac
from datetime import datetime
from enum import Enum
from uuid import UUID

from awp_kernel import tokens


class ResultVerdict(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    RESULT_CONFLICT = "result_conflict"
    LEASE_LOST = "lease_lost"


def holds_lease(
    worker_id: UUID, lease_token: str, holder: UUID | None, lease_token_hash: bytes | None
) -> bool:
    """Whether worker_id, presenting lease_token, holds the lease whose holder and token
    digest are those stored: the one ownership check of every call that acts on a lease."""
    return holder == worker_id and tokens.matches(lease_token, lease_token_hash)


def lease_is_live(
    state: str, now: datetime, lease_expires_at: datetime | None, attempt_deadline: datetime | None
) -> bool:
    return (
        state == "leased"
        and lease_expires_at is not None
        and attempt_deadline is not None
        and now < lease_expires_at
        and now < attempt_deadline
    )


def judge_result(
    *,
    holds: bool,
    state: str,
    stored_result_hash: bytes | None,
    result_hash: bytes,
    now: datetime,
    lease_expires_at: datetime | None,
    attempt_deadline: datetime | None,
) -> ResultVerdict:
    if not holds:
        return ResultVerdict.LEASE_LOST
    if state == "completed" and stored_result_hash is not None:
        if hmac.compare_digest(stored_result_hash, result_hash):
            return ResultVerdict.DUPLICATE
        return ResultVerdict.RESULT_CONFLICT
    if not lease_is_live(state, now, lease_expires_at, attempt_deadline):
        return ResultVerdict.LEASE_LOST
    return ResultVerdict.ACCEPTED
