"""The run rule: what state a run's tasks imply for the run (DESIGN.md §3).

The states themselves are protocol vocabulary (awp_protocol.states); which moves happen
is decided by the storage transactions that make them (awp_db.settle and its SQL).
"""

from __future__ import annotations

from collections.abc import Sequence

from awp_protocol.states import TERMINAL_TASK_STATES, RunState


def run_outcome(task_states: Sequence[str], always_states: Sequence[str] = ()) -> RunState:
    """The run state implied by its tasks' states ('running' until all are terminal).

    task_states: the states of every task but the `always` ones (a map task's elements
    included); always_states: those of the `always` tasks. The outcome is decided by
    the former: failed if one failed (whatever its failure policy), else canceled if one
    was canceled, else succeeded. An always task's own failure is only recorded; but one
    canceled (always tasks are canceled only when the run is) makes the run canceled: the
    run was stopped before it had finished.
    """
    if any(state not in TERMINAL_TASK_STATES for state in (*task_states, *always_states)):
        return "running"
    if any(state == "failed" for state in task_states):
        return "failed"
    if any(state == "canceled" for state in (*task_states, *always_states)):
        return "canceled"
    return "succeeded"
