"""Rich errors on the wire: the reasons clients branch on, and the google.rpc.Status
that carries them in a call's trailers.

A failed call's "grpc-status-details-bin" trailer holds a google.rpc.Status with a
google.rpc.ErrorInfo (domain "awp.dev", a reason from awp.v1.ErrorReason) and, for bad
input, a google.rpc.BadRequest naming each field. This module writes that Status for the
server and reads it back for every client, from the call's trailing metadata pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, NamedTuple

from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from awp.v1 import errors_pb2
from awp_protocol.limits import MAX_REPORTED_VIOLATIONS, QUOTE_CHARS

ERROR_DOMAIN: Final = "awp.dev"
STATUS_DETAILS_KEY: Final = "grpc-status-details-bin"
_REASON_PREFIX: Final = "ERROR_REASON_"


def _reason(value: errors_pb2.ErrorReason.ValueType) -> str:
    # errors.proto is the one list: the string is the enum value's name, unprefixed.
    return errors_pb2.ErrorReason.Name(value).removeprefix(_REASON_PREFIX)


class Reason(StrEnum):
    """The ErrorInfo.reason strings, one per awp.v1.ErrorReason value."""

    INVALID_ARGUMENT = _reason(errors_pb2.ERROR_REASON_INVALID_ARGUMENT)
    INVALID_DEFINITION = _reason(errors_pb2.ERROR_REASON_INVALID_DEFINITION)
    WORKFLOW_NOT_FOUND = _reason(errors_pb2.ERROR_REASON_WORKFLOW_NOT_FOUND)
    RUN_NOT_FOUND = _reason(errors_pb2.ERROR_REASON_RUN_NOT_FOUND)
    DEFINITION_CONFLICT = _reason(errors_pb2.ERROR_REASON_DEFINITION_CONFLICT)
    REQUEST_ID_CONFLICT = _reason(errors_pb2.ERROR_REASON_REQUEST_ID_CONFLICT)
    TOKEN_INVALID = _reason(errors_pb2.ERROR_REASON_TOKEN_INVALID)
    SESSION_INVALID = _reason(errors_pb2.ERROR_REASON_SESSION_INVALID)
    PERMISSION_DENIED = _reason(errors_pb2.ERROR_REASON_PERMISSION_DENIED)
    PROTOCOL_UNSUPPORTED = _reason(errors_pb2.ERROR_REASON_PROTOCOL_UNSUPPORTED)
    WORKER_DRAINING = _reason(errors_pb2.ERROR_REASON_WORKER_DRAINING)
    DATABASE_UNAVAILABLE = _reason(errors_pb2.ERROR_REASON_DATABASE_UNAVAILABLE)
    MALFORMED_REQUEST = _reason(errors_pb2.ERROR_REASON_MALFORMED_REQUEST)
    REQUEST_TOO_LARGE = _reason(errors_pb2.ERROR_REASON_REQUEST_TOO_LARGE)
    RUN_NOT_FINISHED = _reason(errors_pb2.ERROR_REASON_RUN_NOT_FINISHED)
    LEASE_LOST = _reason(errors_pb2.ERROR_REASON_LEASE_LOST)
    STREAM_LIMIT = _reason(errors_pb2.ERROR_REASON_STREAM_LIMIT)
    SCHEDULE_NOT_FOUND = _reason(errors_pb2.ERROR_REASON_SCHEDULE_NOT_FOUND)
    SCHEDULE_EXISTS = _reason(errors_pb2.ERROR_REASON_SCHEDULE_EXISTS)
    MEMO_LIMIT = _reason(errors_pb2.ERROR_REASON_MEMO_LIMIT)
    RUN_FINISHED = _reason(errors_pb2.ERROR_REASON_RUN_FINISHED)
    NOT_WAITING = _reason(errors_pb2.ERROR_REASON_NOT_WAITING)
    RATE_LIMIT_NOT_FOUND = _reason(errors_pb2.ERROR_REASON_RATE_LIMIT_NOT_FOUND)


# A worker's session is over for good: retrying the same call cannot help; the process
# exits and a new one registers (DESIGN.md §4).
PERMANENT_REASONS: Final = frozenset(
    {Reason.SESSION_INVALID, Reason.PROTOCOL_UNSUPPORTED, Reason.TOKEN_INVALID}
)

# google.rpc.Code values of transport trouble and overload: the same call may succeed
# later. INTERNAL and UNKNOWN are here because gRPC reports broken connections ("Stream
# removed") with them, CANCELLED because a server going away cancels its calls.
TRANSIENT_CODES: Final[frozenset[int]] = frozenset(
    {
        code_pb2.UNAVAILABLE,
        code_pb2.DEADLINE_EXCEEDED,
        code_pb2.RESOURCE_EXHAUSTED,
        code_pb2.ABORTED,
        code_pb2.CANCELLED,
        code_pb2.INTERNAL,
        code_pb2.UNKNOWN,
    }
)


class FieldViolation(NamedTuple):
    """One google.rpc.BadRequest entry: the request field (e.g. definition.tasks[2].key)
    and what is wrong with it."""

    field: str
    description: str


class FieldsInvalid(ValueError):
    """Input refused, with every violation found, each naming the offending field."""

    reason: Reason = Reason.INVALID_ARGUMENT

    def __init__(self, violations: Iterable[FieldViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__(join_violations(self.violations))


def join_violations(violations: Iterable[FieldViolation]) -> str:
    found = list(violations)
    text = "; ".join(f"{v.field}: {v.description}" for v in found[:MAX_REPORTED_VIOLATIONS])
    if len(found) > MAX_REPORTED_VIOLATIONS:
        text += f"; and {len(found) - MAX_REPORTED_VIOLATIONS} more"
    return text


def quote(value: str) -> str:
    """User input as an error message may show it: its repr, cut to a short prefix, so that
    no input can make an error too large to deliver."""
    if len(value) <= QUOTE_CHARS:
        return repr(value)
    return f"{value[:QUOTE_CHARS]!r}... ({len(value)} characters)"


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What a failed call's trailers say. An empty reason: the answer did not come from
    AWP's handlers (a transport failure, a proxy, a crash)."""

    reason: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    violations: tuple[FieldViolation, ...] = ()


def encode_status(
    code: int,
    message: str,
    reason: Reason,
    metadata: Mapping[str, str] | None = None,
    violations: Iterable[FieldViolation] = (),
) -> status_pb2.Status:
    """The google.rpc.Status of an AWP error (`code` is a google.rpc.Code value)."""
    details = [
        error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata or {})
    ]
    # The first ones only: the status must fit in the call's trailing metadata.
    found = list(violations)[:MAX_REPORTED_VIOLATIONS]
    if found:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in found
                ]
            )
        )
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return status_pb2.Status(code=code, message=message, details=packed)


def decode_details(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> ErrorDetails:
    """The ErrorInfo and BadRequest of a failed call, from its trailing metadata pairs.

    Never raises: undecodable details read as no details, so a client falls back on the
    status code.
    """
    reason = ""
    metadata: dict[str, str] = {}
    violations: list[FieldViolation] = []
    for key, value in trailing_metadata or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:
            return ErrorDetails()
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    reason = info.reason
                    metadata.update(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    violations.extend(
                        FieldViolation(v.field, v.description) for v in bad.field_violations
                    )
    return ErrorDetails(reason, metadata, tuple(violations))
