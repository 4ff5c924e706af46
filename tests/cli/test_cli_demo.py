"""`make demo` runs `awp demo`: a throwaway stack, the example workflow, a clean stop."""

from __future__ import annotations

from cli.runner import awp


def test_the_demo_succeeds_and_cleans_up() -> None:
    result = awp("demo", timeout=90)
    assert result.code == 0, result.out + result.err
    out = result.out
    assert "Traceback" not in out + result.err
    assert "fetch_forum (2 attempts)" in out  # the flaky fetch was retried
    assert "6 succeeded" in out
    assert '"keywords": [' in out  # the Python action's output
    assert "awp demo: stopped" in out
    assert "awp demo succeeded in" in out
