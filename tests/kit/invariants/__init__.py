"""The invariants of the database (DESIGN.md §10), checked in SQL: the one checker of the
coordinator tests (after every step) and the fault scenarios (once the processes have
done their worst).

check_committed: what holds in every committed state, over the whole database --
a run's and the fleet's concurrency limits, each task's state agreeing with its
dispatches and attempts, each map task agreeing with its elements, items 4 and 5 below
for every run, items 6, 7 and 8 for every stream, schedule and checkpoint.

check_invariants: what a finished scenario must show for the runs it names, plus
everything check_committed checks:

1. Every task is in its expected terminal state; the run too.
2. Exactly one accepted result per succeeded task: one succeeded attempt, the task's
   latest, whose dispatch is `completed` with a result hash, held by the same worker
   under the same fencing token; no other task has a succeeded attempt. A task a retry
   reused instead (RetryRun) has no attempt at all, and the output of the task it names.
3. No result accepted from a non-current lease: every completed dispatch belongs to a
   succeeded/failed attempt that was still the task's latest when it was written, and
   was written before the lease and the attempt deadline ran out.
4. Each run's event seqs are exactly 1..last_seq, its revisions exactly 1..revision and
   never decreasing along seq (every state transaction appends events and bumps once).
5. Nothing is left leased to a stopped or offline worker, and a finished run holds no
   live dispatch and no running attempt.
6. Output streams: no chunk stored after its lease ended, offsets contiguous per
   attempt, positions per task (streams.py, in every committed state).
7. Schedules (schedules.py): every started tick has exactly its one run and every run
   a schedule started its tick; no tick was created under a stale leader epoch.
8. Step checkpoints (checkpoints.py): no checkpoint stored by a stale attempt -- each
   names its own attempt and lease and was stored while that lease was live.
9. Traces (traces.py): a run's span is exported only once the run has finished.
10. Concurrency keys (flow.py): a lease holds exactly its task's keys; never more live
   leases or running attempts holding a key than its max, now or at any instant of the
   attempt history; no unit held by a dispatch whose task is no longer queued/running.
11. Placement (placement.py): a lease's worker had its task's required labels and
   resources; at no instant did a worker's live leases reserve more of a resource than
   its capacity; a dispatch preferring a worker went elsewhere only after its bound.
12. With the scenario's health (fault scenarios: their processes' logs): no deadlock and
   no INTERNAL answer during the scenario (health.py).

The checks live in committed.py, streams.py, schedules.py, checkpoints.py, waits.py,
traces.py, flow.py, priorities.py and placement.py (every committed state), runs.py
(each finished run) and health.py;
this module is the one entry point. The checker also reports how many executions the
tasks cost: at-least-once is paid for in extra attempts, and the output should show that
price, not hide it.
"""

from __future__ import annotations

from collections.abc import Mapping
from uuid import UUID

from kit.invariants.committed import committed
from kit.invariants.common import (
    Db,
    Expect,
    InvariantViolation,
    RunCost,
    raise_if_any,
    snapshot,
)
from kit.invariants.health import ScenarioHealth, health_problems
from kit.invariants.runs import cost, run_problems

__all__ = [
    "Db",
    "Expect",
    "InvariantViolation",
    "RunCost",
    "ScenarioHealth",
    "check_committed",
    "check_invariants",
]


async def check_committed(
    db: Db, *, global_limit: int = 0, finished: bool = False
) -> dict[str, int]:
    """Raises InvariantViolation unless every committed-state invariant holds (and, with
    finished, no run is still running); returns the live and leased dispatch counts."""
    async with snapshot(db) as conn:
        problems, counts = await committed(conn, global_limit)
        if finished:
            unfinished = await conn.fetchval("SELECT count(*) FROM runs WHERE state = 'running'")
            if unfinished:
                problems.append(f"{unfinished} runs still running")
    raise_if_any(problems)
    return counts


async def check_invariants(
    db: Db, expected: Mapping[UUID, Expect], *, health: ScenarioHealth | None = None
) -> dict[UUID, RunCost]:
    """Raises InvariantViolation listing every broken invariant; returns each run's cost."""
    costs: dict[UUID, RunCost] = {}
    async with snapshot(db) as conn:
        problems, _ = await committed(conn)
        for run_id, expect in expected.items():
            problems.extend(await run_problems(conn, run_id, expect))
            costs[run_id] = await cost(conn, run_id)
    if health is not None:
        problems.extend(health_problems(health))
    for each in costs.values():
        print(each.line(), flush=True)
    raise_if_any(problems)
    return costs
