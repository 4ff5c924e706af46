"""Workflows that flow control holds back: tasks sharing a concurrency key, and tasks
using a rate limit (docs/workflows.md, "Concurrency keys", "Rate limits")."""

from __future__ import annotations

from collections.abc import Iterable

from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.ratelimits import RateUse


def keyed(name: str, key: str, tasks: int, *, most: int = 1) -> WorkflowSpec:
    """Independent tasks k0.. each holding a unit of `key` (max `most`)."""
    limits = (ConcurrencyLimit(key, most),)
    return _independent(
        name, (TaskSpec(f"k{i}", "mock", "noop", concurrency_limits=limits) for i in range(tasks))
    )


def rated(name: str, limit: str, units: str, tasks: int) -> WorkflowSpec:
    """Independent tasks r0.. each using `units` of the rate limit `limit`."""
    uses = (RateUse(limit, units),)
    return _independent(
        name, (TaskSpec(f"r{i}", "mock", "noop", rate_limits=uses) for i in range(tasks))
    )


def _independent(name: str, tasks: Iterable[TaskSpec]) -> WorkflowSpec:
    return validate(WorkflowSpec(name, 1, tuple(tasks)))
