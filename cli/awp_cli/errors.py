"""Exit codes, and the one place a failure becomes what the user reads and the code a
script branches on: 0 ok, 1 the run failed or was canceled, 2 the user's input or request
is wrong, 3 the server failed or cannot be reached.

Commands let the SDK's errors (awp_sdk.errors, typed by the server's reason) propagate;
`exit_error` maps them here. A CliError is what the CLI itself refuses before any call
(a workflow file that does not parse, a task with no output) or such an error retold.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from awp_protocol.errors import Reason
from awp_sdk import errors


class Exit(IntEnum):
    OK = 0
    RUN_NOT_SUCCEEDED = 1
    USAGE = 2
    SERVER = 3
    # What a shell reports for a process ended by Ctrl-C (128 + SIGINT).
    INTERRUPTED = 130


class CliError(Exception):
    """A failure told in one line, then optional detail lines; never a traceback.

    `violations` are the server's BadRequest field violations (field, description), one
    per line under the message.
    """

    def __init__(
        self,
        code: Exit,
        message: str,
        details: tuple[str, ...] = (),
        violations: tuple[tuple[str, str], ...] = (),
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.violations = violations
        # The server's google.rpc.ErrorInfo reason, when the server gave one.
        self.reason = reason

    def lines(self) -> tuple[str, ...]:
        return (
            self.message,
            *(f"  {field}: {description}" for field, description in self.violations),
            *(f"  {detail}" for detail in self.details),
        )


def usage(message: str, details: tuple[str, ...] = ()) -> CliError:
    return CliError(Exit.USAGE, message, details)


# The request itself is wrong: the user can fix it and retry.
USER_ERRORS: Final = (
    errors.InvalidArgument,
    errors.NotFound,
    errors.Conflict,
    errors.FailedPrecondition,
    errors.Unauthenticated,
    errors.PermissionDenied,
)
# Hints for reasons whose fix is not obvious from the server's message alone.
_HINTS: Final[dict[str, str]] = {
    Reason.DEFINITION_CONFLICT: (
        "workflows are immutable: give the changed definition a new version"
    ),
    Reason.TOKEN_INVALID: "pass the admin token with --token or AWP_TOKEN",
    Reason.NOT_WAITING: "awp run get RUN shows which tasks wait, and for what",
}


def exit_error(error: errors.AwpError) -> CliError:
    """How the CLI tells an SDK error, and the exit code it stands for."""
    code = Exit.USAGE if isinstance(error, USER_ERRORS) else Exit.SERVER
    if not error.reason:
        # Not from AWP's handlers: the SDK's message already says what happened and where.
        return CliError(code, error.message)
    message = error.message
    if error.violations:
        # The message only joins the violations, which are listed one per line below.
        count = len(error.violations)
        message = f"{count} invalid field{'s' if count > 1 else ''}"
    hint = _HINTS.get(error.reason)
    return CliError(
        code,
        f"{error.reason}: {message}",
        details=(f"hint: {hint}",) if hint else (),
        violations=tuple(error.violations),
        reason=error.reason,
    )
