"""The reuse rule of a retried run (RetryRun, DESIGN.md §13): which tasks of a finished
run a retry may take over as they are, and which it must run again.

A task is run again when it did not succeed, when the caller names it (from_task), or
when anything upstream of it is run again: its input would come from a new output. Every
other task succeeded on the same inputs it would get now, so its output is reused. An
`always` task is run again in every retry: it belongs to the end of each run.
"""

from __future__ import annotations

from collections.abc import Collection

from awp_kernel.definition import WorkflowSpec


def reused_tasks(
    spec: WorkflowSpec, succeeded: Collection[str], from_task: str | None = None
) -> frozenset[str]:
    """The keys of the tasks a retry reuses, given the keys that succeeded in its source."""
    dependents = spec.dependents()
    rerun: set[str] = set()
    pending = [task.key for task in spec.tasks if task.key not in succeeded or task.always]
    if from_task is not None:
        pending.append(from_task)
    while pending:
        key = pending.pop()
        if key not in rerun:
            rerun.add(key)
            pending.extend(dependents[key])
    return frozenset(task.key for task in spec.tasks if task.key not in rerun)
