"""The typography and cell formats of the benchmark's tables (bench/publish.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Entry = dict[str, Any]
# Typography of the documents' tables (spelled out: ruff flags them as look-alikes).
DASH, TIMES = "\u2013", "\u00d7"
NONE = DASH


def _find(results: list[Entry], name: str, workers: int | None = None) -> Entry | None:
    for entry in results:
        if entry["name"] == name and (workers is None or entry.get("workers") == workers):
            return entry
    return None


def _num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _figure(entry: Entry | None, name: str, digits: int = 0, spread: bool = True) -> str:
    if entry is None or name not in entry:
        return NONE
    value = entry[name]
    text = _num(value["median"], digits)
    if spread and entry.get("repetitions", 1) > 1:
        text += f" ({_num(value['min'], digits)}{DASH}{_num(value['max'], digits)})"
    return text


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
