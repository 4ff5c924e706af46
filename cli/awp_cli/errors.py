"""Exit codes and the one error type every command raises for a user-facing failure.

Scripts branch on the exit code: 0 ok, 1 the run failed or was canceled, 2 the
user's input or request is wrong, 3 the server failed or cannot be reached.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    RUN_NOT_SUCCEEDED = 1
    USAGE = 2
    SERVER = 3
    # What a shell reports for a process ended by Ctrl-C (128 + SIGINT).
    INTERRUPTED = 130


class CliError(Exception):
    """A failure told in one line, then optional detail lines; never a traceback.

    `violations` are the server's BadRequest field violations (field, description),
    kept apart so a command can say where in the user's file each field was written.
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
