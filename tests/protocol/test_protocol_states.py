"""The protocol's states against the lifecycles of DESIGN.md §3 (tests/lifecycles.py)."""

from __future__ import annotations

from collections import deque
from typing import Any, get_args

import pytest

from awp_protocol.states import (
    ATTEMPT_STATES,
    DISPATCH_STATES,
    RUN_STATES,
    TASK_STATES,
    TERMINAL_RUN_STATES,
    TERMINAL_TASK_STATES,
    WORKER_STATES,
    AttemptState,
    DispatchState,
    RunState,
    TaskState,
    WorkerState,
)
from kit.lifecycles import (
    ATTEMPT_MOVES,
    DISPATCH_MOVES,
    RUN_MOVES,
    TASK_MOVES,
    WORKER_MOVES,
    Lifecycle,
    illegal_moves,
)

# name, states, literal type, lifecycle, initial state, terminal states per DESIGN.md §3
MACHINES: list[tuple[str, tuple[str, ...], Any, Lifecycle, str, set[str]]] = [
    ("run", RUN_STATES, RunState, RUN_MOVES, "running", {"succeeded", "failed", "canceled"}),
    (
        "task",
        TASK_STATES,
        TaskState,
        TASK_MOVES,
        "pending",
        {"succeeded", "failed", "canceled", "skipped"},
    ),
    (
        "attempt",
        ATTEMPT_STATES,
        AttemptState,
        ATTEMPT_MOVES,
        "running",
        {"succeeded", "failed", "interrupted", "timed_out", "canceled", "suspended"},
    ),
    (
        "dispatch",
        DISPATCH_STATES,
        DispatchState,
        DISPATCH_MOVES,
        "pending",
        {"completed", "expired", "canceled"},
    ),
    ("worker", WORKER_STATES, WorkerState, WORKER_MOVES, "active", {"stopped", "offline"}),
]
machines = pytest.mark.parametrize(
    ("name", "states", "literal", "table", "initial", "terminal"),
    MACHINES,
    ids=[m[0] for m in MACHINES],
)


def reachable(table: Lifecycle, start: str) -> set[str]:
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
    table: Lifecycle,
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
    table: Lifecycle,
    initial: str,
    terminal: set[str],
) -> None:
    assert {state for state, targets in table.items() if not targets} == terminal


@machines
def test_every_state_is_reachable_and_every_path_can_end(
    name: str,
    states: tuple[str, ...],
    literal: Any,
    table: Lifecycle,
    initial: str,
    terminal: set[str],
) -> None:
    assert reachable(table, initial) == set(states)
    for state in states:
        assert reachable(table, state) & terminal, f"{name}: {state} can never finish"


def test_terminal_constants_match_the_lifecycles() -> None:
    assert {s for s, t in RUN_MOVES.items() if not t} == TERMINAL_RUN_STATES
    assert {s for s, t in TASK_MOVES.items() if not t} == TERMINAL_TASK_STATES
    assert set(RUN_STATES) >= TERMINAL_RUN_STATES
    assert set(TASK_STATES) >= TERMINAL_TASK_STATES


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "queued"),  # dependencies not done yet
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
    assert illegal_moves(TASK_MOVES, [(current, target)]) == [(current, target)]


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("pending", "ready"),
        ("pending", "running"),  # a map task starts: its elements run, not it
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
    assert illegal_moves(TASK_MOVES, [(current, target)]) == []


def test_design_lifecycles() -> None:
    assert RUN_MOVES["running"] == {"succeeded", "failed", "canceled"}
    assert ATTEMPT_MOVES["running"] == {
        "succeeded",
        "failed",
        "interrupted",
        "timed_out",
        "canceled",
        "suspended",  # at a wait not yet satisfied (§16)
    }
    assert TASK_MOVES["waiting"] == {"ready", "canceled", "skipped", "succeeded", "failed"}
    assert DISPATCH_MOVES["leased"] == {"completed", "expired", "canceled"}
    assert "completed" not in DISPATCH_MOVES["pending"]  # must be leased first
    assert WORKER_MOVES["draining"] == {"stopped", "offline"}
    assert "active" not in WORKER_MOVES["offline"]  # an offline session never returns


@pytest.mark.parametrize(
    ("current", "target"), [("nonsense", "running"), ("running", "nonsense"), ("", "")]
)
def test_unknown_states_are_illegal(current: str, target: str) -> None:
    assert illegal_moves(RUN_MOVES, [(current, target)]) == [(current, target)]
