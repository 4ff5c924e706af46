"""The wire fuzzer's figures: cases run per RPC and its answers by status, printed when
measured (visible with -s) and repeated in the terminal summary (conftest)."""

from __future__ import annotations

FUZZ_FIGURES: list[str] = []
CASES_RUN: list[int] = []


def report(line: str) -> None:
    print(line, flush=True)
    FUZZ_FIGURES.append(line)
