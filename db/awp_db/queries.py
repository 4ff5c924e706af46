"""Named SQL: each `sql/<aggregate>.sql` file holds `-- name: <query>` sections.

A statement with many parameters names them (`:dispatch_ids`) instead of numbering
them: the loader turns the names into `$n`, in the order they first appear, and `named`
builds the arguments from keywords, so that no call site depends on the order of ten
columns. Rows leave storage as frozen dataclasses: a query's column names are its row
type's field names, and `rows_as` / `row_as` build one from each row.
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

# What the loader reads as a parameter name, and what it must leave alone: comments,
# string literals, quoted identifiers and casts (`::text`), taken whole.
_TOKEN: Final = re.compile(
    r"--[^\n]*|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|::|:([a-z_][a-z0-9_]*)|\$\d+"
)

T = TypeVar("T")

# The parameter names of each statement that names them, by its text as loaded.
_PARAMETERS: dict[str, tuple[str, ...]] = {}


def parse(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    statements: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in statements:
            raise ValueError(f"query {name!r} is defined twice")
        statements[name] = _numbered(name, body.strip())
    return statements


def _numbered(name: str, body: str) -> str:
    """The statement with its :names turned into $1, $2, ... in order of first use."""
    order: list[str] = []
    numbered = False

    def replace(match: re.Match[str]) -> str:
        nonlocal numbered
        token, parameter = match.group(0), match.group(1)
        if token.startswith("$"):
            numbered = True
        if parameter is None:
            return token
        if parameter not in order:
            order.append(parameter)
        return f"${order.index(parameter) + 1}"

    text = _TOKEN.sub(replace, body)
    if order:
        if numbered:
            raise ValueError(f"query {name!r} mixes named and numbered parameters")
        _PARAMETERS[text] = tuple(order)
    return text


def named(query: str, **values: Any) -> list[Any]:
    """The query and its arguments, in its order, for a statement that names its
    parameters: `await conn.fetch(*named(Q["x"], ids=ids, states=states))`."""
    order = _PARAMETERS.get(query)
    if order is None:
        raise ValueError("the query does not name its parameters")
    if set(values) != set(order):
        missing = ", ".join(sorted(set(order) - set(values))) or "none"
        unknown = ", ".join(sorted(set(values) - set(order))) or "none"
        raise ValueError(f"query parameters: missing {missing}; unknown {unknown}")
    return [query, *(values[parameter] for parameter in order)]


@cache
def queries(aggregate: str) -> MappingProxyType[str, str]:
    text = resources.files("awp_db").joinpath("sql", f"{aggregate}.sql").read_text("utf-8")
    return MappingProxyType(parse(text))


async def rows_as(row_type: Callable[..., T], conn: Conn | Pool, query: str, *args: Any) -> list[T]:
    return [row_type(**row) for row in await conn.fetch(query, *args)]


async def row_as(row_type: Callable[..., T], conn: Conn | Pool, query: str, *args: Any) -> T | None:
    row = await conn.fetchrow(query, *args)
    return None if row is None else row_type(**row)
