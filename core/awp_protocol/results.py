"""The check of one Complete result: what the server refuses in a TaskResult, and why;
and the two shapes a result has at the storage boundary (CheckedResult, StoredError).

One function, so that the server's refusal (INVALID_ARGUMENT naming
``results[i].error.message``), a test's fake server and any client that wants to check
first all agree on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from awp.v1 import types_pb2, worker_pb2
from awp_protocol.errors import FieldsInvalid, FieldViolation
from awp_protocol.jsonvalue import JsonInvalid, json_size, struct_to_dict
from awp_protocol.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_ERROR_TYPE_CHARS,
    MAX_LOG_TAIL_CHARS,
    MAX_OUTPUT_BYTES,
    MAX_RATE_UNITS,
    MAX_SLOW_DOWN_MS,
    MAX_TRACEBACK_CHARS,
)

# A failure's text fields and their lengths, in the order they are checked.
_ERROR_TEXT: Final = (
    ("message", MAX_ERROR_MESSAGE_CHARS),
    ("type", MAX_ERROR_TYPE_CHARS),
    ("traceback", MAX_TRACEBACK_CHARS),
    ("log_tail", MAX_LOG_TAIL_CHARS),
)


@dataclass(frozen=True, slots=True)
class StoredError:
    """An ended attempt's error as tasks, attempts and events keep it: the one shape every
    path that ends an attempt writes (a worker's failure, the reaper, a hand-back, an
    offline worker, a map task that cannot start) and the server reads back.

    A failure's traceback and log tail are not part of it: they stay on the attempt row
    (awp_db.attempts), so that task rows and event streams stay small.
    """

    message: str
    retryable: bool
    # The exception's type, when the worker sent one ("" otherwise: left out of the JSON).
    type: str = ""

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "retryable": self.retryable}
        if self.type:
            error["type"] = self.type
        return error

    @classmethod
    def from_json(cls, error: Mapping[str, Any]) -> StoredError:
        """The error as stored; a field an older row lacks reads as empty (not retryable)."""
        return cls(
            str(error.get("message", "")),
            bool(error.get("retryable", False)),
            str(error.get("type", "")),
        )


@dataclass(frozen=True, slots=True)
class Replayed:
    """What an attempt replayed from step memos instead of running the steps
    (MemoSavings): added to its task's savings (tasks.saved_*) when its result is."""

    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


NOTHING_REPLAYED: Final = Replayed()


def check_cost(where: str, tokens: int, cost_usd: float) -> None:
    """What a step reports it cost (StepUsage) or a replay saved (MemoSavings): tokens a
    PostgreSQL bigint, dollars finite and not negative; FieldsInvalid naming the field."""
    if tokens >= 2**63:
        raise _refused(f"{where}.tokens", "must be below 2**63")
    if not math.isfinite(cost_usd) or cost_usd < 0:
        raise _refused(f"{where}.cost_usd", "must be finite and not negative")


def check_replayed(where: str, saved: types_pb2.MemoSavings) -> Replayed:
    check_cost(where, saved.tokens, saved.cost_usd)
    return Replayed(saved.steps, saved.tokens, saved.cost_usd)


@dataclass(frozen=True, slots=True)
class CheckedResult:
    """A result the server may store, for the lease it names: its outcome and what it
    carries, as plain values. Storage takes it as it is (awp_db.leases.Completion).

    A failure's type, traceback and log tail are "" when the worker did not send them.
    """

    dispatch_id: int
    lease_token: str
    outcome: Literal["succeeded", "failed"]
    output: dict[str, Any] | None = None
    error_message: str | None = None
    retryable: bool = True
    error_type: str = ""
    traceback: str = ""
    log_tail: str = ""
    replayed: Replayed = Replayed()
    # What the attempt used of its task's rate limits, (limit, units): replaces the
    # estimate charged at grant. And (limit, retry_after_ms) of each "slow down" report.
    usage: tuple[tuple[str, int], ...] = ()
    slow_down: tuple[tuple[str, int], ...] = ()

    def error(self) -> StoredError | None:
        """The error the attempt, its task and its event keep (None for a success)."""
        if self.outcome != "failed":
            return None
        return StoredError(self.error_message or "", self.retryable, self.error_type)


def check_result(where: str, result: worker_pb2.TaskResult) -> CheckedResult:
    """The result as stored, or FieldsInvalid naming the field under `where`
    (e.g. ``results[3]``)."""
    return replace(
        _checked_outcome(where, result),
        replayed=check_replayed(f"{where}.replayed", result.replayed),
        usage=_usage(where, result),
        slow_down=_slow_down(where, result),
    )


def _usage(where: str, result: worker_pb2.TaskResult) -> tuple[tuple[str, int], ...]:
    for index, used in enumerate(result.usage):
        if not 0 <= used.units <= MAX_RATE_UNITS:
            raise _refused(f"{where}.usage[{index}].units", f"must be 0 to {MAX_RATE_UNITS}")
    return tuple((used.limit, used.units) for used in result.usage)


def _slow_down(where: str, result: worker_pb2.TaskResult) -> tuple[tuple[str, int], ...]:
    found = []
    for index, slow in enumerate(result.slow_down):
        ms = slow.retry_after.ToMilliseconds()
        if not 0 < ms <= MAX_SLOW_DOWN_MS:
            raise _refused(
                f"{where}.slow_down[{index}].retry_after",
                f"must be more than 0 and at most {MAX_SLOW_DOWN_MS // 60_000} minutes",
            )
        found.append((slow.limit, ms))
    return tuple(found)


def _checked_outcome(where: str, result: worker_pb2.TaskResult) -> CheckedResult:
    if result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED:
        if result.HasField("error"):
            raise _refused(f"{where}.error", "only a FAILED result carries an error")
        try:
            output = struct_to_dict(result.output)
        except JsonInvalid as exc:
            raise _refused(f"{where}.output", str(exc)) from None
        if json_size(output) > MAX_OUTPUT_BYTES:
            raise _refused(f"{where}.output", f"at most {MAX_OUTPUT_BYTES} bytes serialised")
        return CheckedResult(result.dispatch_id, result.lease_token, "succeeded", output=output)
    if result.outcome == worker_pb2.RESULT_OUTCOME_FAILED:
        if result.HasField("output") and result.output.fields:
            raise _refused(f"{where}.output", "only a SUCCEEDED result carries an output")
        error = result.error
        for name, limit in _ERROR_TEXT:
            text: str = getattr(error, name)
            if len(text) > limit:
                raise _refused(f"{where}.error.{name}", f"at most {limit} characters")
            if "\x00" in text:
                # PostgreSQL text cannot hold NUL: bad input, not a storage failure.
                raise _refused(f"{where}.error.{name}", "must not contain NUL characters")
        return CheckedResult(
            result.dispatch_id,
            result.lease_token,
            "failed",
            error_message=error.message,
            retryable=error.retryable,
            error_type=error.type,
            traceback=error.traceback,
            log_tail=error.log_tail,
        )
    raise _refused(f"{where}.outcome", "must be SUCCEEDED or FAILED")


def _refused(field: str, description: str) -> FieldsInvalid:
    return FieldsInvalid([FieldViolation(field, description)])
