"""Named SQL: each `sql/<aggregate>.sql` file holds `-- name: <query>` sections.

Rows leave storage as frozen dataclasses: a query's column names are its row type's
field names, and `rows_as` / `row_as` build one from each row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Final, TypeVar

from awp_db.connect import Conn, Pool

_HEADER: Final = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)

T = TypeVar("T")


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


async def rows_as(row_type: Callable[..., T], conn: Conn | Pool, query: str, *args: Any) -> list[T]:
    return [row_type(**row) for row in await conn.fetch(query, *args)]


async def row_as(row_type: Callable[..., T], conn: Conn | Pool, query: str, *args: Any) -> T | None:
    row = await conn.fetchrow(query, *args)
    return None if row is None else row_type(**row)
