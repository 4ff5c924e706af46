"""How the worker reads gRPC errors: machine-readable reasons, transient or permanent.

Which reasons and codes are which is protocol vocabulary (awp_protocol.errors).
"""

from __future__ import annotations

import enum
from typing import Any

import grpc

from awp_protocol.errors import PERMANENT_REASONS, TRANSIENT_CODES, Reason, decode_details

# Call metadata as the stubs want it; only ever the worker token.
Metadata = tuple[tuple[str, str | bytes], ...] | None


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


def error_reason(exc: BaseException) -> str | None:
    """The google.rpc.ErrorInfo reason of a failed call, if it carries one."""
    if not isinstance(exc, grpc.RpcError):
        return None
    try:
        # (key, value) pairs at run time, whatever the stubs say.
        metadata: Any = exc.trailing_metadata()
    except Exception:
        return None
    return decode_details(metadata).reason or None


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
    if reason in (Reason.STREAM_LIMIT, Reason.MEMO_LIMIT):
        # The same append or memo is refused again (the attempt's bytes, the task's memos).
        return Kind.REJECTED
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _oversized(exc):
        # gRPC refused the message's size (ours to the server, or its answer to us):
        # sending the same request again can only fail the same way.
        return Kind.REJECTED
    if code is None or code.value[0] in TRANSIENT_CODES:
        return Kind.TRANSIENT
    return Kind.REJECTED


def server_fault(exc: BaseException) -> bool:
    """INTERNAL or UNKNOWN: transient as far as ``classify`` goes (a broken connection
    reads so), but also what a server answers when it fails on the request itself. A
    caller that resends the same request retries these only a bounded number of times."""
    return status_code(exc) in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def _oversized(exc: grpc.RpcError) -> bool:
    try:
        details = exc.details() or ""
    except Exception:
        return False
    # gRPC's own wording: "Received message larger than max (N vs. M)" / "Sent message ...".
    return "larger than max" in details


def unreachable(exc: BaseException) -> bool:
    """The server could not be reached or did not answer in time (stopped, restarting,
    partitioned): another server may answer the same call."""
    if isinstance(exc, TimeoutError):
        return True  # a local deadline around a call, or a stream silent for too long
    return status_code(exc) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


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
