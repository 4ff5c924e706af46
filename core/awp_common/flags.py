"""Command-line flags that also read AWP_* environment variables (flag wins)."""

from __future__ import annotations

import argparse
import os
from typing import Any


class EnvArgumentParser(argparse.ArgumentParser):
    """`add(flag, env=..., default=...)`: the environment supplies the default."""

    def add(
        self, flag: str, *, env: str, default: Any = None, help: str = "", **kwargs: Any
    ) -> None:
        raw = os.environ.get(env)
        value = default
        if raw is not None and raw != "":
            kind = kwargs.get("type", str)
            try:
                value = kind(raw)
            except (TypeError, ValueError) as exc:
                self.error(f"environment variable {env}={raw!r} is invalid: {exc}")
        suffix = (
            f" (env {env}; default {default!r})" if default not in (None, "") else f" (env {env})"
        )
        self.add_argument(flag, default=value, help=help + suffix, **kwargs)


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
