"""Runs: starting them (all tasks in one transaction), reading them, cancel intent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from awp_common.tracing import RunTrace
from awp_db import locks, settle
from awp_db.connect import Conn, Pool
from awp_db.events import Event, EventBatch
from awp_db.queries import named, queries, row_as, rows_as
from awp_db.signals import RUN_STARTED
from awp_db.workflows import StoredWorkflow
from awp_kernel import concurrency, ratelimits
from awp_kernel.definition import TaskSpec, WorkflowSpec
from awp_kernel.errors import invalid, not_found
from awp_protocol.errors import Reason, quote
from awp_protocol.limits import MAX_INLINE_OUTPUT_JSON_BYTES

Q = queries("runs")


@dataclass(frozen=True, slots=True)
class StartedRun:
    run_id: UUID
    created: bool


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: UUID
    state: str
    revision: int
    last_seq: int
    input: dict[str, Any]
    request_id: str | None
    created_at: datetime
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    concurrency: int
    started_by: str | None
    cancel_requested_by: str | None
    workflow_name: str
    workflow_version: int
    retried_from: UUID | None
    retry_from_task: str | None
    schedule_id: UUID | None
    schedule_tick: datetime | None
    start_at: datetime | None
    trace_id: str | None
    priority: int


@dataclass(frozen=True, slots=True)
class TaskInfo:
    id: int  # its order in the run, and ListTasks' page token
    key: str
    state: str
    executor_kind: str
    action: str
    depends_on: list[str]
    attempts: int
    max_attempts: int
    output: dict[str, Any] | None
    output_omitted: bool  # an output too large to read with the task: awp_db.outputs
    error: dict[str, Any] | None
    retry_at: datetime | None
    finished_at: datetime | None
    reused_from_run_id: UUID | None
    hand_backs: int
    # An element of a map task: that task's key and the element's index.
    map_parent: str | None
    map_index: int | None
    # What replayed step memos saved the task's attempts (docs/design.md §16).
    saved_steps: int = 0
    saved_tokens: int = 0
    saved_cost_usd: float = 0.0
    # Attempts that ended SUSPENDED, and while WAITING what for (docs/design.md §16).
    suspensions: int = 0
    wait_kind: str | None = None
    wait_name: str | None = None
    wait_prompt: str | None = None
    wait_role: str | None = None
    wait_since: datetime | None = None
    wait_due_at: datetime | None = None
    wait_attempt: int | None = None


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    task_key: str
    attempt: int
    state: str
    worker_id: UUID
    dispatch_id: int
    fencing_token: int
    started_at: datetime
    deadline: datetime
    finished_at: datetime | None
    error: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Start:
    """How a run starts beyond its workflow and input: at a time or after a delay on the
    database clock (neither: at once), and the schedule tick that started it, if any
    (awp_db.schedules; the leader epoch goes to the run.created event)."""

    at: datetime | None = None
    delay_ms: int | None = None
    schedule_id: UUID | None = None
    schedule_tick: datetime | None = None
    leader_epoch: int | None = None
    # Its place in a distributed trace (None: not traced).
    trace: RunTrace | None = None
    # The run's priority (awp_protocol.limits MIN_PRIORITY..MAX_PRIORITY; awp_db.grant).
    priority: int = 0

    def payload(self) -> dict[str, Any]:
        if self.schedule_id is None or self.schedule_tick is None:
            return {}
        return {
            "schedule_id": str(self.schedule_id),
            "schedule_tick": self.schedule_tick.isoformat(),
            "leader_epoch": self.leader_epoch,
        }


def parse_run_id(run_id: str, field: str = "run_id") -> UUID:
    try:
        return UUID(run_id)
    except ValueError:
        raise invalid(field, f"{quote(run_id)} is not a run id (a UUID)") from None


async def start(
    conn: Conn,
    workflow: StoredWorkflow,
    run_input: dict[str, Any],
    request_id: str | None,
    started_by: str,
    *,
    start: Start = Start(),
) -> StartedRun:
    """Creates the run and all its tasks (roots ready, the rest pending) atomically; a
    delayed start leaves the roots pending until the coordinator releases them."""
    spec = workflow.spec
    async with conn.transaction():
        inserted = await conn.fetchrow(
            Q["insert"],
            workflow.id,
            run_input,
            spec.concurrency,
            request_id or None,
            started_by,
            start.schedule_id,
            start.schedule_tick,
            start.at,
            start.delay_ms,
            start.trace.run.trace_id if start.trace else None,
            start.trace.run.span_id if start.trace else None,
            start.trace.caller_span if start.trace else None,
            start.priority,
        )
        if inserted is None:
            existing = await conn.fetchval(Q["by_request_id"], request_id)
            return StartedRun(existing, False)
        run_id = inserted["id"]
        rows = await insert_tasks(
            conn, NewTasks(run_id, spec, run_input, delayed=inserted["awaiting_start"])
        )
        events = EventBatch()
        payload: dict[str, Any] = {"workflow": spec.name, "version": spec.version, "by": started_by}
        payload.update(start.payload())
        events.add(Event(run_id, "run.created", to_state="running", payload=payload))
        for row in rows:
            events.task(run_id, row["key"], None, row["state"])
        await events.flush(conn)
        await settle.notify_coordinator(conn, RUN_STARTED)
    return StartedRun(run_id, True)


@dataclass(frozen=True, slots=True)
class NewTasks:
    """The tasks of one new run: its workflow and input, and whether its start is
    delayed (its roots wait for the start time too)."""

    run_id: UUID
    spec: WorkflowSpec
    run_input: dict[str, Any]
    delayed: bool = False


async def insert_tasks(conn: Conn, *new_runs: NewTasks) -> list[asyncpg.Record]:
    """Creates every task of new runs, in one statement (roots ready, the rest pending;
    all pending when a start is delayed): (run_id, key, state) rows. Each task's
    concurrency keys and rate units are rendered from its run's input; an input a
    template cannot render refuses the runs."""
    columns: dict[str, list[Any]] = {name: [] for name in _TASK_COLUMNS}
    for new in new_runs:
        dependents = new.spec.dependents()
        for t in new.spec.tasks:
            held = _concurrency_keys(t, new.run_input)
            uses = _rate_units(t, new.run_input)
            for name, value in (
                ("run_ids", new.run_id),
                ("delayed", new.delayed),
                ("keys", t.key),
                ("executor_kinds", t.executor_kind),
                ("actions", t.action),
                ("inputs", json.dumps(dict(t.input))),
                ("depends_on", json.dumps(list(t.depends_on))),
                ("dependents", json.dumps(dependents[t.key])),
                # An always task waits for the end of the run (awp_db.dynamic releases it).
                ("unfinished_deps", 1 if t.always else len(t.depends_on)),
                ("max_attempts", t.retry.max_attempts),
                ("backoff_initial_ms", t.retry.initial_backoff_ms),
                ("backoff_max_ms", t.retry.max_backoff_ms),
                ("backoff_multipliers", t.retry.multiplier),
                ("timeout_ms", t.timeout_ms),
                ("map_over", t.map.over if t.map else None),
                ("map_paths", json.dumps(t.map.keys()) if t.map else None),
                ("on_failure", t.on_failure),
                ("always", t.always),
                ("concurrency_keys", json.dumps([key for key, _ in held])),
                ("concurrency_max", json.dumps([most for _, most in held])),
                ("rate_names", json.dumps([name for name, _ in uses])),
                ("rate_units", json.dumps([units for _, units in uses])),
                ("wait_tasks", None if t.wait is None else json.dumps(t.wait.to_json())),
                ("priorities", t.priority),
                ("placements", json.dumps(t.placement.to_json())),
            ):
                columns[name].append(value)
    return await conn.fetch(*named(Q["insert_tasks"], **columns))


# insert_tasks' parameters: one entry per task, of whichever run.
_TASK_COLUMNS = (
    "run_ids", "delayed", "keys", "executor_kinds", "actions", "inputs", "depends_on",
    "dependents", "unfinished_deps", "max_attempts", "backoff_initial_ms", "backoff_max_ms",
    "backoff_multipliers", "timeout_ms", "map_over", "map_paths", "on_failure", "always",
    "concurrency_keys", "concurrency_max", "rate_names", "rate_units", "wait_tasks",
    "priorities", "placements",
)  # fmt: skip


def check_renderable(spec: WorkflowSpec, run_input: dict[str, Any]) -> None:
    """INVALID_ARGUMENT (field "input") if a task's concurrency key or rate units cannot
    be rendered from this input: what insert_tasks would refuse, checked ahead (a
    StartRuns entry's error then names its entry)."""
    for task in spec.tasks:
        _concurrency_keys(task, run_input)
        _rate_units(task, run_input)


def _concurrency_keys(task: TaskSpec, run_input: dict[str, Any]) -> list[tuple[str, int]]:
    held: list[tuple[str, int]] = []
    for limit in task.concurrency_limits:
        try:
            held.append((concurrency.render(limit.key, run_input), limit.max))
        except concurrency.KeyUnrenderable as exc:
            raise invalid(
                "input",
                f"task {quote(task.key)}: concurrency key {quote(limit.key)}: {exc}",
            ) from None
    return held


def _rate_units(task: TaskSpec, run_input: dict[str, Any]) -> list[tuple[str, int]]:
    uses: list[tuple[str, int]] = []
    for use in task.rate_limits:
        try:
            uses.append((use.limit, ratelimits.render(use.units, run_input)))
        except ratelimits.UnitsUnrenderable as exc:
            raise invalid(
                "input",
                f"task {quote(task.key)}: units of rate limit {quote(use.limit)}: {exc}",
            ) from None
    return uses


async def get(conn: Conn | Pool, run_id: UUID) -> RunInfo:
    row = await row_as(RunInfo, conn, Q["get"], run_id)
    if row is None:
        raise not_found(Reason.RUN_NOT_FOUND, f"run {run_id}")
    return row


async def task_counts(conn: Conn | Pool, run_ids: list[UUID]) -> dict[UUID, dict[str, int]]:
    counts: dict[UUID, dict[str, int]] = {run_id: {} for run_id in run_ids}
    for row in await conn.fetch(Q["task_counts"], run_ids):
        counts[row["run_id"]][row["state"]] = row["n"]
    return counts


async def tasks(
    conn: Conn | Pool, run_id: UUID, *, after: int = 0, limit: int | None = None
) -> list[TaskInfo]:
    """The run's tasks in order, from the one after task id `after`, `limit` of them
    (None: all)."""
    return await rows_as(
        TaskInfo, conn, Q["tasks"], run_id, MAX_INLINE_OUTPUT_JSON_BYTES, after, limit
    )


async def attempts(conn: Conn | Pool, run_id: UUID, limit: int | None = None) -> list[AttemptInfo]:
    """The run's attempts, oldest first, `limit` of them (None: all)."""
    return await rows_as(AttemptInfo, conn, Q["attempts"], run_id, limit)


async def attempt_count(conn: Conn | Pool, run_id: UUID) -> int:
    count: int = await conn.fetchval(Q["attempt_count"], run_id)
    return count


async def request_cancel(conn: Conn, run_id: UUID, reason: str, by: str) -> bool:
    """Persists the intent (the coordinator converges it). False if already final/requested."""
    events = EventBatch()
    async with conn.transaction():
        locked = await locks.runs(conn, [run_id])
        if not locked:
            raise not_found(Reason.RUN_NOT_FOUND, f"run {run_id}")
        changed = await conn.fetchval(Q["request_cancel"], run_id, reason or None, by) is not None
        if changed:
            events.add(Event(run_id, "run.cancel_requested", payload={"reason": reason, "by": by}))
            await events.flush(conn)
            await settle.notify_coordinator(conn, "cancel")
    return changed


async def progress(conn: Conn | Pool, run_id: UUID) -> tuple[str, int]:
    """(state, last_seq): enough for a watcher to know whether it has seen everything."""
    row = await conn.fetchrow(Q["progress"], run_id)
    if row is None:
        raise not_found(Reason.RUN_NOT_FOUND, f"run {run_id}")
    return row["state"], row["last_seq"]


async def list_page(
    conn: Conn | Pool,
    workflow_name: str | None,
    state: str | None,
    before: tuple[datetime, UUID] | None,
    limit: int,
) -> list[RunInfo]:
    """Newest first; `before` is the (created_at, id) of the previous page's last run."""
    created_at, run_id = before if before is not None else (None, None)
    return await rows_as(RunInfo, conn, Q["list"], workflow_name, state, created_at, run_id, limit)
