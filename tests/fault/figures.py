"""Measured figures of the fault suite (recovery times, execution costs): printed when
measured (visible with -s) and repeated in the terminal summary (conftest)."""

from __future__ import annotations

FIGURES: list[str] = []


def report_figure(line: str) -> None:
    print(line, flush=True)
    FIGURES.append(line)
