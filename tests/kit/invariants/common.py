"""What the checks share: the ways to reach the database, what a run must end as, what
its tasks cost, and the error every broken invariant is reported by."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

# Any way to run a query: the checker takes a connection or a pool.
Db = asyncpg.Connection | asyncpg.Pool


@dataclass(frozen=True, slots=True)
class Expect:
    """What one run must end as. task_states: one state for every task, or per key
    (keys not listed must then be `default_task_state`)."""

    run_state: str = "succeeded"
    task_states: str | Mapping[str, str] = "succeeded"
    default_task_state: str | None = None

    def task_state(self, key: str) -> str | None:
        if isinstance(self.task_states, str):
            return self.task_states
        return self.task_states.get(key, self.default_task_state)


@dataclass(slots=True)
class RunCost:
    run_id: UUID
    tasks: int = 0
    executions: int = 0  # attempt rows: every execution a worker was handed
    attempts_by_state: Counter[str] = field(default_factory=Counter)
    tasks_with_extra_executions: int = 0
    max_executions_per_task: int = 0
    workers: int = 0

    # Executions beyond the first of each task: the price of at-least-once (and retries).
    extra_executions: int = 0

    def line(self) -> str:
        states = ",".join(f"{k}={v}" for k, v in sorted(self.attempts_by_state.items()))
        return (
            f"COST run={str(self.run_id)[:8]} tasks={self.tasks} executions={self.executions}"
            f" extra={self.extra_executions} tasks_repeated={self.tasks_with_extra_executions}"
            f" max_per_task={self.max_executions_per_task} workers={self.workers}"
            f" attempts[{states}]"
        )


class InvariantViolation(AssertionError):
    pass


@contextlib.asynccontextmanager
async def snapshot(db: Db) -> AsyncIterator[asyncpg.Connection]:
    """One consistent view of the database: every check sees the same committed state."""
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(db, asyncpg.Pool):
            db = await stack.enter_async_context(db.acquire())
        await stack.enter_async_context(db.transaction(isolation="repeatable_read"))
        yield db


def raise_if_any(problems: list[str]) -> None:
    if problems:
        raise InvariantViolation(
            f"{len(problems)} invariant violation(s):\n" + "\n".join(f"  - {p}" for p in problems)
        )
