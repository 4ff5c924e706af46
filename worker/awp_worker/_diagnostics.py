"""What a failed attempt reports for whoever debugs it: the exception's type, a bounded
traceback starting at the action's own frame, and the action's last log lines.

The log tail is what the action wrote while it ran: every log record it emitted (through
``ctx.logger`` or any ``logging`` logger, at the worker's log level) and, in the
``awp-worker`` process, what it printed to stdout. An attempt collects them in a
``LogTail`` held in a context variable around the executor call; a root log handler and
a stdout wrapper append to whichever tail the writing code's context holds, so the
lines of concurrent attempts never mix (a sync action's thread runs in a copy of its
attempt's context). Only a failure reports the tail, and nothing else is collected:
the worker's own lines and other attempts' lines are outside the context.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import os
import sys
import sysconfig
import threading
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Final, TextIO

from awp_protocol.limits import (
    MAX_ERROR_TYPE_CHARS,
    MAX_LOG_TAIL_CHARS,
    MAX_LOG_TAIL_LINES,
    MAX_TRACEBACK_CHARS,
)
from awp_worker._sdk import PermanentError, RetryableError

# Frames of the platform around an action: the worker's own and the standard library's
# (asyncio, the thread pool), skipped from the outside in.
_PLATFORM_DIRS: Final = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
)
_TRACEBACK_HEAD: Final = "Traceback (most recent call last):\n"
# Classes that only say whether to retry: the message is the news, not the class.
_SIGNALS: Final = (RetryableError, PermanentError)

_current: contextvars.ContextVar[LogTail | None] = contextvars.ContextVar(
    "awp_log_tail", default=None
)


# ---------------------------------------------------------------- exceptions


def exception_type(exc: BaseException) -> str:
    """'KeyError', 'myapp.errors.QuotaExceeded'; '' for RetryableError / PermanentError
    themselves (their subclasses are named)."""
    cls = type(exc)
    if cls in _SIGNALS:
        return ""
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    return bounded_head(name, MAX_ERROR_TYPE_CHARS)


def action_traceback(exc: BaseException) -> str:
    """The traceback from the action's outermost frame on, bounded; '' when the exception
    did not pass through an action's frame (the worker's own checks, the mock executor)."""
    frames = _from_action(exc.__traceback__)
    if frames is None:
        return ""
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    return keep_innermost(printable(text), MAX_TRACEBACK_CHARS)


def _from_action(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PLATFORM_DIRS):
        tb = tb.tb_next
    return tb


def keep_innermost(text: str, limit: int) -> str:
    """A traceback cut to `limit` characters from the outside in: its first line, a line
    saying how much was cut, then its last lines (the innermost frames and the error)."""
    if len(text) <= limit:
        return text
    head = _TRACEBACK_HEAD if text.startswith(_TRACEBACK_HEAD) else ""
    # Sized for the largest count, so the result never exceeds the limit.
    tail = newest_lines(text, limit - len(head) - len(_cut_line(len(text))))
    return head + _cut_line(len(text) - len(head) - len(tail)) + tail


def _cut_line(count: int) -> str:
    return f"  ... [{count} characters of outer frames cut]\n"


def newest_lines(text: str, room: int) -> str:
    """The last `room` characters of text at most, from the start of a line when a whole
    line fits (a single line longer than `room` keeps its end)."""
    if len(text) <= room:
        return text
    start = len(text) - room
    if text[start - 1] == "\n":
        return text[start:]
    newline = text.find("\n", start)
    return text[newline + 1 :] if 0 <= newline < len(text) - 1 else text[start:]


def bounded_head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """NUL cannot be stored (PostgreSQL text): spelled out instead of refused."""
    return text.replace("\x00", "\\x00")


# ---------------------------------------------------------------- log tail


class LogTail:
    """The last lines one attempt's action wrote, bounded in lines and characters."""

    def __init__(self, max_lines: int = MAX_LOG_TAIL_LINES, max_chars: int = MAX_LOG_TAIL_CHARS):
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._partial = ""
        self._max_lines = max_lines
        self._max_chars = max_chars
        # Several threads of one action may write at once.
        self._lock = threading.Lock()

    def add_record(self, text: str) -> None:
        """A whole log record (possibly several lines: an exception's traceback)."""
        with self._lock:
            self._lines.extend(text.splitlines() or [""])

    def write(self, text: str) -> None:
        """A piece of printed output: lines end at newlines, wherever the pieces break."""
        with self._lock:
            *done, self._partial = (self._partial + text).split("\n")
            self._lines.extend(done)

    def text(self) -> str:
        with self._lock:
            lines = list(self._lines)
            if self._partial:
                lines.append(self._partial)
        return newest_lines(printable("\n".join(lines[-self._max_lines :])), self._max_chars)


@contextlib.contextmanager
def collecting(tail: LogTail) -> Iterator[None]:
    """Lines written in this context (and tasks and action threads it starts) go to `tail`."""
    _install_log_handler()
    token = _current.set(tail)
    try:
        yield
    finally:
        _current.reset(token)


class _TailHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        tail = _current.get()
        if tail is not None:
            try:
                tail.add_record(self.format(record))
            except Exception:
                self.handleError(record)


_HANDLER: Final = _TailHandler()


def _install_log_handler() -> None:
    # Checked at every attempt, not once: reconfiguring logging replaces the root's handlers.
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)


class _TeeStdout:
    """sys.stdout as it was, and a copy of each write to the writing attempt's tail."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        tail = _current.get()
        if tail is not None:
            tail.write(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def collect_stdout() -> None:
    """Copies what actions print into their attempt's tail: for the ``awp-worker`` process,
    which owns its stdout (a library embedding the runtime keeps its own)."""
    if not isinstance(sys.stdout, _TeeStdout):
        sys.stdout = _TeeStdout(sys.stdout)
