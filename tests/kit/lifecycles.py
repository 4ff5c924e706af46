"""The lifecycles of DESIGN.md §3 as data: which state moves the design allows.

No production code decides a move from a table (each storage transaction makes its own
moves in SQL); these tables are the specification that the protocol's state sets
(tests/protocol) and the moves the real system records (tests/coordinator) are
checked against.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Final

from awp_db.connect import Pool

Lifecycle = dict[str, frozenset[str]]

RUN_MOVES: Final[Lifecycle] = {
    "running": frozenset({"succeeded", "failed", "canceled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
}

TASK_MOVES: Final[Lifecycle] = {
    # pending -> running: a map task, once its upstream succeeded (its elements run).
    "pending": frozenset({"ready", "running", "canceled", "skipped"}),
    # ready -> waiting: a wait task, which no worker runs (§16).
    "ready": frozenset({"queued", "canceled", "skipped", "waiting"}),
    # queued -> ready: the dispatch was withdrawn (no compatible worker), nothing spent.
    "queued": frozenset({"running", "ready", "canceled", "skipped"}),
    # running -> waiting: its attempt suspended at a wait (§16); waiting -> ready: the wait
    # was satisfied or timed out.
    "running": frozenset({"succeeded", "failed", "waiting_retry", "canceled", "waiting"}),
    "waiting_retry": frozenset({"ready", "canceled", "skipped"}),
    "waiting": frozenset({"ready", "canceled", "skipped", "succeeded", "failed"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "canceled": frozenset(),
    "skipped": frozenset(),
}

ATTEMPT_MOVES: Final[Lifecycle] = {
    "running": frozenset(
        {"succeeded", "failed", "interrupted", "timed_out", "canceled", "suspended"}
    ),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "interrupted": frozenset(),
    "suspended": frozenset(),
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


async def recorded_moves(pool: Pool) -> dict[str, list[tuple[str, str]]]:
    """Each event type's moves; a creation (no from_state) counts as a move from the
    lifecycle's initial state, or as the initial state itself."""
    moves: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in await pool.fetch("SELECT type, from_state, to_state FROM state_events"):
        if row["type"] not in EVENT_LIFECYCLES:
            continue
        _, initial = EVENT_LIFECYCLES[row["type"]]
        if row["from_state"] is None and row["to_state"] == initial:
            continue
        moves[row["type"]].append((row["from_state"] or initial, row["to_state"]))
    return moves
