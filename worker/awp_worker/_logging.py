"""Structured logs: lines about a lease carry run_id, task_key, attempt and worker_id.

The line format is every AWP process's (``awp_common.logs``: JSON lines or text, with
``extra=`` fields). Fields reach a line two ways: ``bind()`` sets them in a context
variable, inherited by tasks created afterwards and by action threads, so even user
code's log lines carry them; ``LeaseLog`` adds one lease's fields to lines written
outside its task. Secrets (worker, session and lease tokens) are never log fields.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

from awp_common import logs

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_fields: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "awp_log_fields", default=_EMPTY
)


def bind(**fields: Any) -> contextvars.Token[Mapping[str, Any]]:
    """Add fields to every log line of the current context (and tasks it creates)."""
    return _fields.set(MappingProxyType({**_fields.get(), **fields}))


def unbind(token: contextvars.Token[Mapping[str, Any]]) -> None:
    _fields.reset(token)


def bound_fields() -> Mapping[str, Any]:
    return _fields.get()


class LeaseLog(logging.LoggerAdapter[logging.Logger]):
    """A logger for lines about one lease, written from any task."""

    def __init__(self, logger: logging.Logger, fields: Mapping[str, Any]) -> None:
        super().__init__(logger, dict(fields))

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


class ContextFilter(logging.Filter):
    """Puts the bound fields on each record, in the thread that logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _fields.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def configure(log_format: str = "json", level: str = "INFO") -> None:
    """JSON lines (or text) on stderr, bound fields included."""
    logs.setup(log_format, level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(ContextFilter())
    # Their debug chatter (e.g. gRPC's "Loaded running loop") says nothing about AWP.
    for noisy in ("asyncio", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
