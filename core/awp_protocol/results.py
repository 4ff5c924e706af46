"""The check of one Complete result: what the server refuses in a TaskResult, and why.

One function, so that the server's refusal (INVALID_ARGUMENT naming
``results[i].error.message``), a test's fake server and any client that wants to check
first all agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from awp.v1 import worker_pb2
from awp_protocol.errors import FieldsInvalid, FieldViolation
from awp_protocol.jsonvalue import JsonInvalid, json_size, struct_to_dict
from awp_protocol.limits import MAX_ERROR_MESSAGE_CHARS, MAX_OUTPUT_BYTES


@dataclass(frozen=True, slots=True)
class CheckedResult:
    """A result the server may store: its outcome and what it carries, as plain values."""

    outcome: Literal["succeeded", "failed"]
    output: dict[str, Any] | None = None
    error_message: str | None = None
    retryable: bool = True


def check_result(where: str, result: worker_pb2.TaskResult) -> CheckedResult:
    """The result as stored, or FieldsInvalid naming the field under `where`
    (e.g. ``results[3]``)."""
    if result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED:
        if result.HasField("error"):
            raise _refused(f"{where}.error", "only a FAILED result carries an error")
        try:
            output = struct_to_dict(result.output)
        except JsonInvalid as exc:
            raise _refused(f"{where}.output", str(exc)) from None
        if json_size(output) > MAX_OUTPUT_BYTES:
            raise _refused(f"{where}.output", f"at most {MAX_OUTPUT_BYTES} bytes serialised")
        return CheckedResult("succeeded", output=output)
    if result.outcome == worker_pb2.RESULT_OUTCOME_FAILED:
        if result.HasField("output") and result.output.fields:
            raise _refused(f"{where}.output", "only a SUCCEEDED result carries an output")
        message = result.error.message
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            raise _refused(
                f"{where}.error.message", f"at most {MAX_ERROR_MESSAGE_CHARS} characters"
            )
        if "\x00" in message:
            # PostgreSQL text cannot hold NUL: bad input, not a storage failure.
            raise _refused(f"{where}.error.message", "must not contain NUL characters")
        return CheckedResult("failed", error_message=message, retryable=result.error.retryable)
    raise _refused(f"{where}.outcome", "must be SUCCEEDED or FAILED")


def _refused(field: str, description: str) -> FieldsInvalid:
    return FieldsInvalid([FieldViolation(field, description)])
