"""Named SQL: each `sql/<aggregate>.sql` file holds `-- name: <query>` sections."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Final

_HEADER: Final = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    named: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in named:
            raise ValueError(f"query {name!r} is defined twice")
        named[name] = body.strip()
    return named


@cache
def queries(aggregate: str) -> MappingProxyType[str, str]:
    text = resources.files("awp_db").joinpath("sql", f"{aggregate}.sql").read_text("utf-8")
    return MappingProxyType(parse(text))
