"""Structured logs: JSON lines in production, readable text under `awp dev`.

Context such as run_id, task_key, attempt and worker_id travels as `extra=` fields and
is printed with every line.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final

from awp_common.tracing import TraceIds

FORMATS: Final = ("json", "text")
LEVELS: Final = ("debug", "info", "warning", "error")
DEFAULT_FORMAT: Final = "json"
DEFAULT_LEVEL: Final = "info"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_extras(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        text = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            text = f"{text}  {fields}"
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        return text


def setup(log_format: str = DEFAULT_FORMAT, level: str = DEFAULT_LEVEL) -> None:
    if log_format not in FORMATS:
        raise ValueError(f"log format must be 'json' or 'text', not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(TraceIds())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
