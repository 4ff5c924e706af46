"""`make demo` runs `awp demo`: a throwaway stack, the example workflow, a clean stop."""

from __future__ import annotations

from cli.runner import awp


def test_the_demo_succeeds_and_cleans_up() -> None:
    result = awp("demo", timeout=90)
    assert result.code == 0, result.out + result.err
    out = result.out
    assert "Traceback" not in out + result.err
    assert "summarize (2 attempts)" in out  # the flaky step was retried
    assert "4 elements: 4 succeeded" in out  # one search per planned query
    assert "9 succeeded" in out  # plan, the map task and its 4 elements, and 3 more
    assert '"keywords": [' in out  # the Python action's output
    assert "awp demo: stopped" in out
    assert "awp demo succeeded in" in out
