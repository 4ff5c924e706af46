"""RetryRun: resume a finished run instead of restarting it (DESIGN.md §13).

The new run is the source's workflow version and input. Its tasks are created as
StartRun creates them, in the same transaction; those the reuse rule keeps
(awp_kernel.resume) then take the source's output and end `succeeded` with no attempt and
`reused_from_run_id` set, and what a success sets off follows exactly as for a success
(settle.follow_up: dependents unlocked, map tasks started). A run none of whose tasks is
left to run finishes at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from awp_db import dynamic, locks, runs, settle
from awp_db.connect import Conn
from awp_db.events import Event, EventBatch
from awp_db.queries import queries, row_as
from awp_db.runs import StartedRun
from awp_db.signals import RUN_STARTED
from awp_kernel.definition import WorkflowSpec
from awp_kernel.errors import AwpError, ErrorKind, invalid, not_found
from awp_kernel.resume import reused_tasks
from awp_protocol.errors import Reason, quote

Q = queries("retry")


@dataclass(frozen=True, slots=True)
class _Source:
    input: dict[str, Any]
    workflow_id: int
    definition: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RetryRequest:
    source: UUID
    from_task: str | None
    request_id: str | None
    by: str


async def retry(conn: Conn, request: RetryRequest) -> StartedRun:
    """Starts the retry of a finished run, or returns the one its request_id started."""
    async with conn.transaction():
        if request.request_id:
            existing = await conn.fetchrow(Q["by_request_id"], request.request_id)
            if existing is not None:
                return _same_request(request, existing)
        locked = await locks.runs(conn, [request.source])
        if not locked:
            raise not_found(Reason.RUN_NOT_FOUND, f"run {request.source}")
        if locked[0].state == "running":
            canceling = locked[0].cancel_requested_at is not None
            raise AwpError(
                ErrorKind.FAILED_PRECONDITION,
                Reason.RUN_NOT_FINISHED,
                f"run {request.source} is still {'canceling' if canceling else 'running'}: "
                "only a finished run can be retried (wait for it, or cancel it first)",
                metadata={"run_id": str(request.source)},
            )
        source = await row_as(_Source, conn, Q["source"], request.source)
        assert source is not None, "a locked run exists"
        spec = WorkflowSpec.from_json(source.definition)
        if request.from_task is not None and request.from_task not in {t.key for t in spec.tasks}:
            raise invalid(
                "from_task",
                f"run {request.source} ({spec.name}@{spec.version}) has no task "
                f"{quote(request.from_task)}",
            )
        succeeded = [row["key"] for row in await conn.fetch(Q["succeeded_keys"], request.source)]
        reuse = reused_tasks(spec, succeeded, request.from_task)

        run_id = await conn.fetchval(
            Q["insert"],
            source.workflow_id,
            source.input,
            spec.concurrency,
            request.request_id,
            request.by,
            request.source,
            request.from_task,
        )
        if run_id is None:  # the same request_id, committed meanwhile
            existing = await conn.fetchrow(Q["by_request_id"], request.request_id)
            return _same_request(request, existing)
        await runs.insert_tasks(conn, runs.NewTasks(run_id, spec, source.input))
        origins = await _reuse(conn, run_id, request.source, reuse)

        events = EventBatch()
        payload: dict[str, Any] = {
            "workflow": spec.name,
            "version": spec.version,
            "by": request.by,
            "retried_from": str(request.source),
        }
        if request.from_task is not None:
            payload["from_task"] = request.from_task
        events.add(Event(run_id, "run.created", to_state="running", payload=payload))
        for task in await runs.tasks(conn, run_id):
            origin = origins.get(task.key)
            events.task(
                run_id,
                task.key,
                None,
                task.state,
                payload=None if origin is None else {"reused_from": str(origin)},
            )
        await settle.finish_runs(conn, [run_id], events)
        await events.flush(conn)
        await settle.notify_coordinator(conn, RUN_STARTED)
    return StartedRun(run_id, True)


async def _reuse(conn: Conn, run_id: UUID, source: UUID, keys: frozenset[str]) -> dict[str, UUID]:
    """Ends the reused tasks with their source outputs and sets off what a success does
    (dependents unlocked, map tasks started: settle.follow_up); the run each output came
    from, by task key."""
    if not keys:
        return {}
    origins: dict[str, UUID] = {}
    reused: list[dynamic.Finished] = []
    for row in await conn.fetch(Q["reuse_tasks"], run_id, source, sorted(keys)):
        origins[row["key"]] = row["reused_from_run_id"]
        reused.append(settle.finished_task(row))
    # The run's creation events (retry) give each task's state once it is all done.
    unrecorded = EventBatch()
    _, failed_runs, _ = await settle.follow_up(conn, reused, unrecorded)
    if failed_runs:
        await settle.stop_runs(conn, sorted(failed_runs), "skipped", unrecorded)
    return origins


def _same_request(request: RetryRequest, existing: Any) -> StartedRun:
    """The run request_id already started, if it was this retry; otherwise a conflict."""
    if existing["retried_from"] != request.source or existing["retry_from_task"] != (
        request.from_task
    ):
        raise AwpError(
            ErrorKind.ALREADY_EXISTS,
            Reason.REQUEST_ID_CONFLICT,
            f"request_id {request.request_id!r} already started run {existing['id']}, "
            f"which is not a retry of run {request.source}"
            + (f" from task {request.from_task!r}" if request.from_task else ""),
            metadata={"run_id": str(existing["id"])},
        )
    return StartedRun(existing["id"], False)
