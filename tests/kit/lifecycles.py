"""The lifecycles of DESIGN.md §3 as data: which state moves the design allows.

No production code decides a move from a table (each storage transaction makes its own
moves in SQL); these tables are the specification that the protocol's state sets
(tests/protocol) and the moves the real system records (tests/coordinator) are
checked against.
"""

from __future__ import annotations

from typing import Final

Lifecycle = dict[str, frozenset[str]]

RUN_MOVES: Final[Lifecycle] = {
    "running": frozenset({"succeeded", "failed", "canceled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
}

TASK_MOVES: Final[Lifecycle] = {
    "pending": frozenset({"ready", "canceled", "skipped"}),
    "ready": frozenset({"queued", "canceled", "skipped"}),
    # queued -> ready: the dispatch was withdrawn (no compatible worker), nothing spent.
    "queued": frozenset({"running", "ready", "canceled", "skipped"}),
    "running": frozenset({"succeeded", "failed", "waiting_retry", "canceled"}),
    "waiting_retry": frozenset({"ready", "canceled", "skipped"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
    "skipped": frozenset(),
}

ATTEMPT_MOVES: Final[Lifecycle] = {
    "running": frozenset({"succeeded", "failed", "interrupted", "timed_out", "canceled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "interrupted": frozenset(),
    "timed_out": frozenset(),
    "canceled": frozenset(),
}

DISPATCH_MOVES: Final[Lifecycle] = {
    "pending": frozenset({"leased", "expired", "canceled"}),
    "leased": frozenset({"completed", "expired", "canceled"}),
    "completed": frozenset(),
    "expired": frozenset(),
    "canceled": frozenset(),
}

WORKER_MOVES: Final[Lifecycle] = {
    "active": frozenset({"draining", "stopped", "offline"}),
    "draining": frozenset({"stopped", "offline"}),
    "stopped": frozenset(),
    "offline": frozenset(),
}

# The lifecycle each kind of state event follows, and where it starts.
EVENT_LIFECYCLES: Final[dict[str, tuple[Lifecycle, str]]] = {
    "run.state": (RUN_MOVES, "running"),
    "task.state": (TASK_MOVES, "pending"),
    "attempt.state": (ATTEMPT_MOVES, "running"),
}


def illegal_moves(lifecycle: Lifecycle, moves: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(a, b) for a, b in moves if b not in lifecycle.get(a, frozenset())]
