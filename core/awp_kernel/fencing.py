"""The lease rule: whether a reported result may be written (DESIGN.md §4).

A lease is valid iff its session is live (checked by the caller), the dispatch is
`leased` to this worker, the token's digest matches, and the database clock is before
both the lease expiry and the attempt deadline. A repeat of an accepted result is a
DUPLICATE; a different result for the same lease a RESULT_CONFLICT.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from enum import Enum


class ResultVerdict(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    RESULT_CONFLICT = "result_conflict"
    LEASE_LOST = "lease_lost"


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


def judge_append(
    *,
    holder_and_token_match: bool,
    state: str,
    now: datetime,
    lease_expires_at: datetime | None,
    attempt_deadline: datetime | None,
) -> ResultVerdict:
    """An output stream's append (DESIGN.md §15): the lease rule alone, as a result's.
    There is no DUPLICATE of a finished attempt: its stream is closed."""
    if holder_and_token_match and lease_is_live(state, now, lease_expires_at, attempt_deadline):
        return ResultVerdict.ACCEPTED
    return ResultVerdict.LEASE_LOST


def judge_result(
    *,
    holder_and_token_match: bool,
    state: str,
    stored_result_hash: bytes | None,
    result_hash: bytes,
    now: datetime,
    lease_expires_at: datetime | None,
    attempt_deadline: datetime | None,
) -> ResultVerdict:
    if not holder_and_token_match:
        return ResultVerdict.LEASE_LOST
    if state == "completed" and stored_result_hash is not None:
        if hmac.compare_digest(stored_result_hash, result_hash):
            return ResultVerdict.DUPLICATE
        return ResultVerdict.RESULT_CONFLICT
    if not lease_is_live(state, now, lease_expires_at, attempt_deadline):
        return ResultVerdict.LEASE_LOST
    return ResultVerdict.ACCEPTED
