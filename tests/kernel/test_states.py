"""Lifecycle tables of runs, tasks, attempts, dispatches and workers (DESIGN.md §3)."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awp_kernel.states import (
    ATTEMPT_STATES,
    ATTEMPT_TRANSITIONS,
    DISPATCH_STATES,
    DISPATCH_TRANSITIONS,
    RUN_STATES,
    RUN_TRANSITIONS,
    TASK_STATES,
    TASK_TRANSITIONS,
    TERMINAL_RUN_STATES,
    TERMINAL_TASK_STATES,
    WORKER_STATES,
    WORKER_TRANSITIONS,
    AttemptState,
    DispatchState,
    IllegalTransition,
    RunState,
    TaskState,
    WorkerState,
    check_transition,
    run_outcome,
)

PROPERTY = settings(max_examples=200, deadline=None)

# name, states, literal type, table, initial state, terminal states per DESIGN.md §3
MACHINES: list[tuple[str, tuple[str, ...], Any, dict[str, frozenset[str]], str, set[str]]] = [
    ("run", RUN_STATES, RunState, RUN_TRANSITIONS, "running", {"succeeded", "failed", "canceled"}),
    (
        "task",
        TASK_STATES,
        TaskState,
        TASK_TRANSITIONS,
        "pending",
        {"succeeded", "failed", "canceled", "skipped"},
    ),
    (
        "attempt",
        ATTEMPT_STATES,
        AttemptState,
        ATTEMPT_TRANSITIONS,
        "running",
        {"succeeded", "failed", "interrupted", "timed_out", "canceled"},
    ),
    (
        "dispatch",
        DISPATCH_STATES,
        DispatchState,
        DISPATCH_TRANSITIONS,
        "pending",
        {"completed", "expired", "canceled"},
    ),
    ("worker", WORKER_STATES, WorkerState, WORKER_TRANSITIONS, "active", {"stopped", "offline"}),
]
machines = pytest.mark.parametrize(
    ("name", "states", "literal", "table", "initial", "terminal"),
    MACHINES,
    ids=[m[0] for m in MACHINES],
)


def reachable(table: dict[str, frozenset[str]], start: str) -> set[str]:
    seen = {start}
    queue = deque([start])
    while queue:
        for target in table[queue.popleft()]:
            if target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


@machines
def test_every_state_appears_once(
    name: str,
    states: tuple[str, ...],
    literal: Any,
    table: dict[str, frozenset[str]],
    initial: str,
    terminal: set[str],
) -> None:
    assert len(set(states)) == len(states)
    assert set(get_args(literal)) == set(states)
    assert set(table) == set(states), f"{name}: every state has a row"
    for source, targets in table.items():
        assert targets <= set(states), f"{name}: {source} leads to unknown states"
        assert source not in targets, f"{name}: {source} -> {source} is not a state change"


@machines
def test_terminal_states_have_no_exits(
    name: str,
    states: tuple[str, ...],
    literal: Any,
    table: dict[str, frozenset[str]],
    initial: str,
    terminal: set[str],
) -> None:
    assert {state for state, targets in table.items() if not targets} == terminal


@machines
def test_every_state_is_reachable_and_every_path_can_end(
    name: str,
    states: tuple[str, ...],
    literal: Any,
    table: dict[str, frozenset[str]],
    initial: str,
    terminal: set[str],
) -> None:
    assert reachable(table, initial) == set(states)
    for state in states:
        assert reachable(table, state) & terminal, f"{name}: {state} can never finish"


def test_terminal_constants_match_tables() -> None:
    assert {s for s, t in RUN_TRANSITIONS.items() if not t} == TERMINAL_RUN_STATES
    assert {s for s, t in TASK_TRANSITIONS.items() if not t} == TERMINAL_TASK_STATES
    assert set(RUN_STATES) >= TERMINAL_RUN_STATES
    assert set(TASK_STATES) >= TERMINAL_TASK_STATES


@machines
def test_check_transition_agrees_with_the_table(
    name: str,
    states: tuple[str, ...],
    literal: Any,
    table: dict[str, frozenset[str]],
    initial: str,
    terminal: set[str],
) -> None:
    for current, target in itertools.product(states, repeat=2):
        if target in table[current]:
            check_transition(table, current, target)
        else:
            with pytest.raises(IllegalTransition, match=f"{current} -> {target}"):
                check_transition(table, current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "queued"),  # dependencies not done yet
        ("pending", "running"),
        ("ready", "running"),  # an attempt exists only after a dispatch is claimed
        ("queued", "waiting_retry"),  # no attempt yet, no retry spent
        ("queued", "failed"),
        ("waiting_retry", "queued"),  # back through ready once the backoff passes
        ("waiting_retry", "running"),
        ("running", "ready"),
        ("running", "skipped"),
        ("succeeded", "ready"),
        ("failed", "waiting_retry"),
        ("canceled", "ready"),
        ("skipped", "pending"),
    ],
)
def test_illegal_task_moves(current: str, target: str) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(TASK_TRANSITIONS, current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "ready"),
        ("ready", "queued"),
        ("queued", "running"),
        ("queued", "ready"),  # dispatch withdrawn
        ("running", "succeeded"),
        ("running", "failed"),
        ("running", "waiting_retry"),
        ("waiting_retry", "ready"),
        ("pending", "canceled"),
        ("running", "canceled"),
        ("pending", "skipped"),
        ("waiting_retry", "skipped"),
    ],
)
def test_legal_task_moves(current: str, target: str) -> None:
    check_transition(TASK_TRANSITIONS, current, target)


def test_design_lifecycles() -> None:
    assert RUN_TRANSITIONS["running"] == {"succeeded", "failed", "canceled"}
    assert ATTEMPT_TRANSITIONS["running"] == {
        "succeeded",
        "failed",
        "interrupted",
        "timed_out",
        "canceled",
    }
    assert DISPATCH_TRANSITIONS["leased"] == {"completed", "expired", "canceled"}
    assert "completed" not in DISPATCH_TRANSITIONS["pending"]  # must be leased first
    assert WORKER_TRANSITIONS["draining"] == {"stopped", "offline"}
    assert "active" not in WORKER_TRANSITIONS["offline"]  # an offline session never returns


@pytest.mark.parametrize(
    ("current", "target"), [("nonsense", "running"), ("running", "nonsense"), ("", "")]
)
def test_unknown_states_are_illegal(current: str, target: str) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(RUN_TRANSITIONS, current, target)


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


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
