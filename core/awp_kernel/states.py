"""The run rule: what state a run's tasks imply for the run (DESIGN.md §3).

The states themselves are protocol vocabulary (awp_protocol.states); which moves happen
is decided by the storage transactions that make them (awp_db.settle and its SQL).
"""

from __future__ import annotations

from awp_protocol.states import TERMINAL_TASK_STATES, RunState


def run_outcome(task_states: list[str]) -> RunState:
    """The run state implied by its tasks' states ('running' until all are terminal)."""
    if any(state not in TERMINAL_TASK_STATES for state in task_states):
        return "running"
    if any(state == "failed" for state in task_states):
        return "failed"
    if any(state == "canceled" for state in task_states):
        return "canceled"
    return "succeeded"
