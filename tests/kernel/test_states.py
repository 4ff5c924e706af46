"""The run rule: a run's outcome from its tasks' states (DESIGN.md §3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awp_kernel.states import run_outcome
from awp_protocol.states import RUN_STATES, TASK_STATES, TERMINAL_TASK_STATES

PROPERTY = settings(max_examples=200, deadline=None)


# --- run outcome ---------------------------------------------------------------------------

NON_TERMINAL = sorted(set(TASK_STATES) - TERMINAL_TASK_STATES)


@pytest.mark.parametrize(
    ("task_states", "outcome"),
    [
        (["succeeded"], "succeeded"),
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "failed", "skipped"], "failed"),
        (["failed", "canceled"], "failed"),
        (["succeeded", "canceled"], "canceled"),
        (["canceled", "skipped"], "canceled"),
        (["succeeded", "running"], "running"),
        (["failed", "pending"], "running"),
        (["waiting_retry"], "running"),
        (["queued", "canceled"], "running"),
    ],
)
def test_run_outcome_examples(task_states: list[str], outcome: str) -> None:
    assert run_outcome(task_states) == outcome


@PROPERTY
@given(st.lists(st.sampled_from(TASK_STATES), min_size=1, max_size=12), st.randoms())
def test_run_outcome_property(task_states: list[str], rng: Any) -> None:
    outcome = run_outcome(task_states)
    assert outcome in RUN_STATES
    shuffled = list(task_states)
    rng.shuffle(shuffled)
    assert run_outcome(shuffled) == outcome, "order of tasks does not matter"
    if any(s in NON_TERMINAL for s in task_states):
        assert outcome == "running"
    elif "failed" in task_states:
        assert outcome == "failed"
    elif "canceled" in task_states:
        assert outcome == "canceled"
    else:
        assert outcome == "succeeded"
        assert "succeeded" in task_states or set(task_states) == {"skipped"}
