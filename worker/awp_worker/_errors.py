"""How the worker reads gRPC errors: machine-readable reasons, transient or permanent."""

from __future__ import annotations

import enum
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

DETAILS_KEY = "grpc-status-details-bin"
# Call metadata as the stubs want it; only ever the worker token.
Metadata = tuple[tuple[str, str | bytes], ...] | None

SESSION_INVALID = "SESSION_INVALID"
PROTOCOL_UNSUPPORTED = "PROTOCOL_UNSUPPORTED"
WORKER_DRAINING = "WORKER_DRAINING"
PERMANENT_REASONS = frozenset({SESSION_INVALID, PROTOCOL_UNSUPPORTED})

# Transport trouble and overload: the same call may succeed later. INTERNAL and UNKNOWN
# are here too because gRPC reports broken connections ("Stream removed") with them.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)


class Kind(enum.Enum):
    TRANSIENT = "transient"  # retry with backoff
    PERMANENT = "permanent"  # the session is over: stop everything, exit non-zero
    REJECTED = "rejected"  # this request will never succeed as sent; the session is fine


class SessionLost(Exception):
    """The worker's session ended for good; the process must exit and register anew."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def status_code(exc: BaseException) -> grpc.StatusCode | None:
    if isinstance(exc, grpc.RpcError):
        try:
            code = exc.code()
        except Exception:
            return None
        return code if isinstance(code, grpc.StatusCode) else None
    return None


def error_info(exc: BaseException) -> error_details_pb2.ErrorInfo | None:
    """The google.rpc.ErrorInfo detail of a failed call, if it carries one."""
    if not isinstance(exc, grpc.RpcError):
        return None
    try:
        # (key, value) pairs at run time, whatever the stubs say.
        metadata: Any = exc.trailing_metadata() or ()
    except Exception:
        return None
    for key, value in metadata:
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except Exception:
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    return None


def error_reason(exc: BaseException) -> str | None:
    info = error_info(exc)
    return info.reason if info is not None and info.reason else None


def classify(exc: Exception) -> Kind:
    """TRANSIENT, PERMANENT (session over) or REJECTED (give up on this request)."""
    if not isinstance(exc, grpc.RpcError):
        return Kind.TRANSIENT  # e.g. a local timeout around the call
    reason = error_reason(exc)
    code = status_code(exc)
    # UNAUTHENTICATED: a session the server no longer knows (SESSION_INVALID) or a
    # wrong cluster worker token (TOKEN_INVALID); neither heals by retrying.
    if reason in PERMANENT_REASONS or code == grpc.StatusCode.UNAUTHENTICATED:
        return Kind.PERMANENT
    if code is None or code in TRANSIENT_CODES:
        return Kind.TRANSIENT
    return Kind.REJECTED


def is_transient(exc: BaseException) -> bool:
    """The retry predicate for tenacity. Only an ``Exception`` can be transient: a
    ``CancelledError`` (a BaseException) must end the retrying, never be retried."""
    return isinstance(exc, Exception) and classify(exc) is Kind.TRANSIENT


def describe(exc: BaseException) -> str:
    """A one-line description safe for logs (a status, never metadata or tokens)."""
    if isinstance(exc, grpc.RpcError):
        code = status_code(exc)
        name = code.name if code is not None else "UNKNOWN"
        reason = error_reason(exc)
        try:
            details = exc.details() or ""
        except Exception:
            details = ""
        text = f"{name} [{reason}]" if reason else name
        return f"{text}: {details}" if details else text
    return f"{type(exc).__name__}: {exc}"


def session_lost(exc: BaseException) -> SessionLost:
    reason = error_reason(exc)
    if reason is None:
        code = status_code(exc)
        reason = code.name if code is not None else "UNKNOWN"
    return SessionLost(reason, describe(exc))
