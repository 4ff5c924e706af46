"""Concurrency keys: a task's limits whose key is computed from its run's input.

A limit is a key template and a max: at most `max` leases whose task holds the rendered
key are live (pending or leased dispatches) at any instant, across every run and every
workflow (docs/workflows.md, "Concurrency keys"). The template grammar is deliberately
tiny, so that a key is never code:

    template    := ( literal | placeholder )+          at most MAX_KEY_TEMPLATE_CHARS
    literal     := [A-Za-z0-9_.:/=@+-]+
    placeholder := "{" "input" ( "." segment )+ "}"
    segment     := [A-Za-z0-9_-]+                      an object key, or a list index

`{input.user.id}` is the run input's "user" object's "id". A placeholder must name a
string, an integer or a boolean (written as JSON writes it); a missing field, an object,
a list, null or a fraction refuses the run at StartRun, naming the task and template. A
template without placeholders (`llm`) is a named limit shared by every task that
declares it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from awp_protocol.errors import quote
from awp_protocol.limits import (
    MAX_CONCURRENCY_KEY_CHARS,
    MAX_CONCURRENCY_LIMITS,
    MAX_KEY_TEMPLATE_CHARS,
    MAX_KEYED_CONCURRENCY,
)

_LITERAL: Final = r"[A-Za-z0-9_.:/=@+-]+"
_SEGMENT: Final = r"[A-Za-z0-9_-]+"
_PLACEHOLDER: Final = rf"\{{input(?P<path>(?:\.{_SEGMENT})+)\}}"
_TOKEN: Final = re.compile(rf"(?P<literal>{_LITERAL})|{_PLACEHOLDER}")
TEMPLATE_RULE: Final = (
    "literal text [A-Za-z0-9_.:/=@+-] and placeholders {input.<field>[.<field>...]}, "
    f"at most {MAX_KEY_TEMPLATE_CHARS} characters"
)


class KeyTemplateInvalid(ValueError):
    """The template does not follow the grammar; the message says where."""


class KeyUnrenderable(ValueError):
    """The run's input has no scalar where a placeholder points; the message says which."""


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most `max` live leases of tasks holding the key `key` renders to."""

    key: str
    max: int

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "max": self.max}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConcurrencyLimit:
        return cls(key=data["key"], max=data["max"])


Part = str | tuple[str, ...]  # a literal, or a placeholder's path into the input


def parse(template: str) -> tuple[Part, ...]:
    """The template's parts in order; KeyTemplateInvalid naming the first bad character."""
    if not template:
        raise KeyTemplateInvalid("is empty")
    if len(template) > MAX_KEY_TEMPLATE_CHARS:
        raise KeyTemplateInvalid(f"is longer than {MAX_KEY_TEMPLATE_CHARS} characters")
    parts: list[Part] = []
    position = 0
    while position < len(template):
        match = _TOKEN.match(template, position)
        if match is None:
            raise KeyTemplateInvalid(
                f"{quote(template)}: unexpected {template[position]!r} at character "
                f"{position + 1}; a key is {TEMPLATE_RULE}"
            )
        if match["literal"] is not None:
            parts.append(match["literal"])
        else:
            parts.append(tuple(match["path"].removeprefix(".").split(".")))
        position = match.end()
    return tuple(parts)


def violations(limits: Sequence[ConcurrencyLimit]) -> list[tuple[str, str]]:
    """(field suffix, description) for each bad limit of one task, e.g.
    ("concurrency_limits[0].key", "...")."""
    found: list[tuple[str, str]] = []
    if len(limits) > MAX_CONCURRENCY_LIMITS:
        found.append(("concurrency_limits", f"at most {MAX_CONCURRENCY_LIMITS} limits per task"))
    seen: set[str] = set()
    for index, limit in enumerate(limits):
        where = f"concurrency_limits[{index}]"
        try:
            parse(limit.key)
        except KeyTemplateInvalid as exc:
            found.append((f"{where}.key", f"key template {exc}"))
        if limit.key in seen:
            found.append((f"{where}.key", f"{quote(limit.key)} is listed twice"))
        seen.add(limit.key)
        if not 1 <= limit.max <= MAX_KEYED_CONCURRENCY:
            found.append((f"{where}.max", f"must be 1 to {MAX_KEYED_CONCURRENCY}"))
    return found


def render(template: str, run_input: Mapping[str, Any]) -> str:
    """The key for this run input; KeyUnrenderable naming the placeholder that fails."""
    out: list[str] = []
    for part in parse(template):
        if isinstance(part, str):
            out.append(part)
            continue
        out.append(_scalar(_lookup(run_input, part), "{input." + ".".join(part) + "}"))
    key = "".join(out)
    if len(key) > MAX_CONCURRENCY_KEY_CHARS:
        raise KeyUnrenderable(
            f"renders to {len(key)} characters; at most {MAX_CONCURRENCY_KEY_CHARS}"
        )
    return key


def _lookup(value: Any, path: tuple[str, ...]) -> Any:
    for depth, segment in enumerate(path):
        shown = "{input." + ".".join(path[: depth + 1]) + "}"
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            raise KeyUnrenderable(f"{shown} is not in the run's input")
    return value


def _scalar(value: Any, shown: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    raise KeyUnrenderable(
        f"{shown} is {type(value).__name__}; a key part must be a string, an integer or a boolean"
    )
