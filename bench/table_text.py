"""The typography and cell formats of the benchmark's tables (bench/publish.py), and the
names of scenarios the tables single out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Entry = dict[str, Any]
# Typography of the documents' tables (spelled out: ruff flags them as look-alikes).
DASH, TIMES = "\u2013", "\u00d7"
NONE = DASH
# The one scenario run on the embedded PostgreSQL 18 rather than Debian's 15 of the rest
# (single_run 4 x 8 again; bench.py starts that server for it), so that a newer
# server's figure sits beside the peers' comparison without doubling the run.
PG18_SCENARIO = "single_run_pg18"


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
