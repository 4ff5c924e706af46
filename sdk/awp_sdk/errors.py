"""The errors the SDK raises, typed by the server's ErrorInfo reason (never its text).

Every one is an ``AwpError`` carrying ``reason`` (an awp_protocol.errors.Reason value,
or "" when the answer did not come from AWP's handlers: the network, a proxy), the
message, the gRPC status code and the BadRequest field violations. Branch on the class
(``except RunNotFound``) or on ``reason``; messages are for people.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import grpc

from awp_common import tls as tls_flags
from awp_protocol import errors
from awp_protocol.errors import FieldViolation, Reason
from awp_protocol.jsonvalue import JsonInvalid


class AwpError(Exception):
    """A failure of an AWP call or run."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        code: grpc.StatusCode | None = None,
        violations: Iterable[FieldViolation] = (),
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code
        self.violations = tuple(violations)
        self.metadata = dict(metadata or {})


class InvalidArgument(AwpError, ValueError):
    """The request is wrong (INVALID_ARGUMENT, MALFORMED_REQUEST, REQUEST_TOO_LARGE, or a
    value refused before sending); ``violations`` name each field."""


class DefinitionInvalid(InvalidArgument):
    """A workflow definition breaks a rule (INVALID_DEFINITION). Raised before sending too:
    a code-defined workflow is checked with the server's own function."""


class NotFound(AwpError, LookupError):
    """No such workflow, run or schedule."""


class WorkflowNotFound(NotFound):
    pass


class RunNotFound(NotFound):
    pass


class ScheduleNotFound(NotFound):
    pass


class RateLimitNotFound(NotFound):
    pass


class Conflict(AwpError):
    """The request contradicts what is stored (ALREADY_EXISTS)."""


class DefinitionConflict(Conflict):
    """This name and version hold another definition: a changed one needs a new version."""


class RequestIdConflict(Conflict):
    """The request id already started a run of another workflow, version or input."""


class ScheduleExists(Conflict):
    """A schedule of that name exists (Schedules.update changes it)."""


class Unauthenticated(AwpError):
    """No token, or one the server does not know (TOKEN_INVALID)."""


class PermissionDenied(AwpError):
    """The token's role may not do this (PERMISSION_DENIED)."""


class Unavailable(AwpError, ConnectionError):
    """The server cannot be reached, or its database is down: the same call may succeed
    later."""


class DeadlineExceeded(AwpError, TimeoutError):
    """The server did not answer within the call's timeout."""


class WaitTimeout(AwpError, TimeoutError):
    """``RunHandle.result(timeout=...)`` ran out of time; the run goes on."""


class FailedPrecondition(AwpError):
    """The request is valid but the state of what it names forbids it now."""


class RunNotFinished(FailedPrecondition):
    """Only a finished run can be retried (RUN_NOT_FINISHED)."""


class ProtocolUnsupported(FailedPrecondition):
    """The server does not speak this client's protocol version (PROTOCOL_UNSUPPORTED)."""


class WorkerDraining(FailedPrecondition):
    """The worker session is draining: it takes no new work (WORKER_DRAINING)."""


class LeaseLost(FailedPrecondition):
    """The lease is no longer held: revoked, expired or taken over (LEASE_LOST)."""


class RunFinished(FailedPrecondition):
    """The run has ended, so it takes no signal (RUN_FINISHED)."""


class NotWaiting(FailedPrecondition):
    """The task is not waiting for an approval: not reached yet, decided already, or its
    run has ended (NOT_WAITING)."""


class MemoLimit(AwpError):
    """A step's memo past its size, or past the memos (count or bytes) one task may store
    (MEMO_LIMIT); the message names the limit."""


class StreamLimit(AwpError):
    """An output stream's limit (STREAM_LIMIT): the bytes one attempt may stream, or the
    readers one server serves at once (try another replica, or later)."""


class UnknownEnumValue(AwpError):
    """The server sent an enum value this SDK does not know (a newer server): upgrade
    awp_sdk. ``enum`` is the proto enum's full name, ``value`` the number."""

    def __init__(self, message: str, *, enum: str, value: int) -> None:
        super().__init__(message)
        self.enum = enum
        self.value = value


class OutputsOmitted(AwpError):
    """RunDetail.outputs() on a record that does not hold every output (read with
    ``get_run(..., outputs=False)``): ``task_keys`` names the tasks whose output it
    lacks; ``tasks_omitted`` counts tasks it does not list at all."""

    def __init__(self, message: str, *, task_keys: tuple[str, ...], tasks_omitted: int) -> None:
        super().__init__(message)
        self.task_keys = task_keys
        self.tasks_omitted = tasks_omitted


class RunFailed(AwpError):
    """The run failed. ``task_key`` is the task whose failure ended it, ``error`` its
    error message, ``attempt`` the attempt that failed; ``error_type``, ``traceback`` and
    ``log_tail`` are what the worker kept of the exception (None when it sent none)."""

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        task_key: str | None,
        error: str | None,
        attempt: int | None,
        retryable: bool | None,
        error_type: str | None = None,
        traceback: str | None = None,
        log_tail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.task_key = task_key
        self.error = error
        self.attempt = attempt
        self.retryable = retryable
        self.error_type = error_type
        self.traceback = traceback
        self.log_tail = log_tail


class RunCanceled(AwpError):
    """The run was canceled before it finished."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


# Every protocol reason has its class (a test holds this against awp_protocol's Reason).
BY_REASON: Final[Mapping[str, type[AwpError]]] = {
    Reason.INVALID_ARGUMENT: InvalidArgument,
    Reason.MALFORMED_REQUEST: InvalidArgument,
    Reason.REQUEST_TOO_LARGE: InvalidArgument,
    Reason.INVALID_DEFINITION: DefinitionInvalid,
    Reason.WORKFLOW_NOT_FOUND: WorkflowNotFound,
    Reason.RUN_NOT_FOUND: RunNotFound,
    Reason.DEFINITION_CONFLICT: DefinitionConflict,
    Reason.REQUEST_ID_CONFLICT: RequestIdConflict,
    Reason.TOKEN_INVALID: Unauthenticated,
    Reason.SESSION_INVALID: Unauthenticated,
    Reason.PERMISSION_DENIED: PermissionDenied,
    Reason.DATABASE_UNAVAILABLE: Unavailable,
    Reason.RUN_NOT_FINISHED: RunNotFinished,
    Reason.PROTOCOL_UNSUPPORTED: ProtocolUnsupported,
    Reason.WORKER_DRAINING: WorkerDraining,
    Reason.LEASE_LOST: LeaseLost,
    Reason.STREAM_LIMIT: StreamLimit,
    Reason.SCHEDULE_NOT_FOUND: ScheduleNotFound,
    Reason.SCHEDULE_EXISTS: ScheduleExists,
    Reason.MEMO_LIMIT: MemoLimit,
    Reason.RUN_FINISHED: RunFinished,
    Reason.NOT_WAITING: NotWaiting,
    Reason.RATE_LIMIT_NOT_FOUND: RateLimitNotFound,
}
# A reason this SDK does not know yet (a newer server) falls back on the status code.
_BY_CODE: Final[Mapping[grpc.StatusCode, type[AwpError]]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}
# What to do about an unreachable server, said wherever one is met.
START_HINT: Final = (
    "start one on this machine with `awp dev`, or point AWP_ADDRESS (the CLI's --address) "
    "at a running one"
)


def json_refused(exc: JsonInvalid, where: str) -> InvalidArgument:
    """The error of a value that cannot be sent exactly (a run's input, a signal's
    payload), naming where in it the problem is."""
    return InvalidArgument(
        str(exc),
        reason=Reason.INVALID_ARGUMENT,
        violations=[FieldViolation(exc.where or where, exc.problem)],
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def from_rpc_error(error: grpc.aio.AioRpcError, address: str, tls_on: bool = False) -> AwpError:
    """The typed error a failed call stands for (tls_on: whether it went over TLS)."""
    details = errors.decode_details(error.trailing_metadata())
    code = error.code()
    message = one_line(error.details() or "")
    if details.reason:
        kind = BY_REASON.get(details.reason) or _BY_CODE.get(code, AwpError)
        return kind(
            message,
            reason=details.reason,
            code=code,
            violations=details.violations,
            metadata=details.metadata,
        )
    # No ErrorInfo: the answer did not come from AWP's handlers (transport, proxy, crash).
    if code == grpc.StatusCode.UNAVAILABLE:
        why = tls_flags.mismatch(error.details() or "", tls_on) or message
        return Unavailable(f"cannot reach awp-server at {address}: {why}; {START_HINT}", code=code)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"awp-server at {address} did not answer in time", code=code)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return AwpError(f"{address} does not serve awp.v1.ControlService ({message})", code=code)
    return _BY_CODE.get(code, AwpError)(f"{code.name}: {message}", code=code)


def is_transient(error: grpc.aio.AioRpcError) -> bool:
    """Worth the same call again: transport trouble, not an answer from AWP's handlers."""
    if errors.decode_details(error.trailing_metadata()).reason:
        return False
    return error.code().value[0] in errors.TRANSIENT_CODES
