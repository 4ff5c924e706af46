"""The wire fuzzer's figures in the terminal summary."""

from __future__ import annotations

import pytest
from fuzz_figures import CASES_RUN, FUZZ_FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FUZZ_FIGURES:
        terminalreporter.section("awp wire fuzz figures")
        for line in FUZZ_FIGURES:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"fuzz: {sum(CASES_RUN)} cases over {len(CASES_RUN)} RPCs, "
            "every answer OK or a defined status with ErrorInfo (no UNKNOWN, no INTERNAL)"
        )
