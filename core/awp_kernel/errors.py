"""Errors every layer raises and the transport maps to status codes.

`reason` is one of awp.v1.ErrorReason (awp_protocol.errors.Reason), which clients branch
on; the message is for people.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from awp_protocol.errors import FieldViolation, Reason, join_violations


class ErrorKind(Enum):
    """The google.rpc.Code an error is sent with (the member names are the code names)."""

    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    FAILED_PRECONDITION = "failed_precondition"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    UNAVAILABLE = "unavailable"
    RESOURCE_EXHAUSTED = "resource_exhausted"


class AwpError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        reason: Reason,
        message: str,
        violations: Iterable[FieldViolation] = (),
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason
        self.message = message
        self.violations = tuple(violations)
        self.metadata = dict(metadata or {})


def invalid(field: str, description: str, reason: Reason = Reason.INVALID_ARGUMENT) -> AwpError:
    return invalid_many([FieldViolation(field, description)], reason)


def invalid_many(violations: Iterable[FieldViolation], reason: Reason) -> AwpError:
    found = tuple(violations)
    return AwpError(ErrorKind.INVALID_ARGUMENT, reason, join_violations(found), found)


def session_invalid(detail: str = "unknown worker session") -> AwpError:
    # Deliberately vague to callers: which check failed is logged, not returned.
    return AwpError(ErrorKind.UNAUTHENTICATED, Reason.SESSION_INVALID, detail)


def protocol_unsupported(version: int, supported: Iterable[int]) -> AwpError:
    versions = ", ".join(str(v) for v in supported)
    return AwpError(
        ErrorKind.FAILED_PRECONDITION,
        Reason.PROTOCOL_UNSUPPORTED,
        f"protocol version {version} is not supported; this server speaks {versions}",
        metadata={"supported": versions},
    )


def worker_draining() -> AwpError:
    return AwpError(
        ErrorKind.FAILED_PRECONDITION,
        Reason.WORKER_DRAINING,
        "the session is draining: it may not claim new work",
    )


def not_found(reason: Reason, what: str) -> AwpError:
    return AwpError(ErrorKind.NOT_FOUND, reason, f"{what} not found")


def database_unavailable(detail: str) -> AwpError:
    return AwpError(
        ErrorKind.UNAVAILABLE, Reason.DATABASE_UNAVAILABLE, f"database unavailable: {detail}"
    )
