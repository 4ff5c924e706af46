"""The console's pages (and the fragments the run page loads into itself)."""

from __future__ import annotations

import asyncio
import secrets
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from awp_console import api, graph, metrics, recovery, timeline
from awp_console.web import TASK_STATES, Caller, caller, console_of, page
from awp_protocol.roles import Role
from awp_protocol.states import RUN_STATES, TERMINAL_RUN_STATES
from awp_sdk.enums import CheckpointKind
from awp_sdk.limits import RateLimits
from awp_sdk.records import (
    Attempt,
    Identity,
    Run,
    RunDetail,
    StoredWorkflow,
    TaskError,
    TaskStatus,
    TaskWait,
    Worker,
)
from awp_sdk.resumes import asked_for_decision
from awp_sdk.schedules import Schedules

RUNS_PAGE: Final = 25
# The overview measures re-dispatch times over the newest runs of at most this many tasks
# (a run's attempts are read whole; the run page measures any run).
RECOVERY_RUNS: Final = 20
RECOVERY_MAX_TASKS: Final = 2_000
# The overview's queue table: task states of running runs, per executor kind.
QUEUE_STATES: Final = ("ready", "queued", "running", "waiting_retry", "waiting")
# The runs list names the task a failed run failed on, read with GetRun (a page has at
# most RUNS_PAGE of them), for runs of at most this many tasks: a larger one's count of
# failed tasks is shown, its page names them.
FAILURE_MAX_TASKS: Final = 2_000
_NEVER: Final = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Failure:
    """The task a failed run failed on, and why."""

    task_key: str
    error: TaskError | None


async def overview(request: Request) -> Response:
    who = await caller(request)
    urls = console_of(request).settings.metrics_urls
    stats, workers, recent, scraped = await asyncio.gather(
        who.api.get_stats(),
        who.api.list_workers(include_inactive=True),
        who.api.list_runs_page(page_size=RECOVERY_RUNS),
        metrics.scrape(urls) if urls else _nothing(),
    )
    small = [r for r in recent.items if r.task_count <= RECOVERY_MAX_TASKS]
    details = await asyncio.gather(*(who.api.get_run(r.id, outputs=False) for r in small))
    by_id = {w.id: w for w in workers}
    found = [found for d in details for found in recovery.recoveries(d.attempts, by_id)]
    queue: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for count in stats.tasks_by_state:
        queue[count.executor_kind][count.state] += count.count
    for dispatches in stats.dispatches_by_state:
        queue[dispatches.executor_kind][f"dispatch_{dispatches.state}"] += dispatches.count
    return page(
        request,
        who,
        "overview.html",
        stats=stats,
        queue=dict(sorted(queue.items())),
        queue_states=QUEUE_STATES,
        active_workers=[w for w in workers if w.state in ("active", "draining")],
        scraped=scraped,
        recovery=recovery.summary(found),
        recovery_runs=len(small),
        recent_runs=len(recent.items),
        recovery_max_tasks=RECOVERY_MAX_TASKS,
    )


async def _nothing() -> None:
    return None


async def runs(request: Request) -> Response:
    who = await caller(request)
    workflow = request.query_params.get("workflow", "").strip()
    state = request.query_params.get("state", "")
    if state and state not in RUN_STATES:
        raise HTTPException(400, f"state must be one of {', '.join(RUN_STATES)}")
    token = request.query_params.get("page", "")
    found, workflows = await asyncio.gather(
        who.api.list_runs_page(
            workflow=workflow or None, state=state or None, page_token=token, page_size=RUNS_PAGE
        ),
        who.api.list_workflows_page(page_size=1000),
    )
    looked_up = [
        r.id for r in found.items if r.state == "failed" and r.task_count <= FAILURE_MAX_TASKS
    ]
    details = await asyncio.gather(*(who.api.get_run(i, outputs=False) for i in looked_up))
    failures = {d.run.id: failure for d in details if (failure := first_failure(d.tasks.values()))}
    return page(
        request,
        who,
        "runs.html",
        runs=found.items,
        failures=failures,
        next_token=found.next_page_token,
        first_page=not token,
        workflow=workflow,
        state=state,
        run_states=RUN_STATES,
        workflow_names=sorted({w.name for w in workflows.items}),
    )


def first_failure(tasks: Iterable[TaskStatus]) -> Failure | None:
    """The failed task that failed first: the one that failed the run. A map's element
    comes before its map task, which fails with it."""
    failed = [t for t in tasks if t.state == "failed"]
    if not failed:
        return None
    first = min(
        failed, key=lambda t: (t.finished_at or _NEVER, graph.fanout_of(t.key) is None, t.key)
    )
    return Failure(first.key, first.error)


async def run(request: Request) -> Response:
    who = await caller(request)
    run_id = request.path_params["run_id"]
    detail = await who.api.get_run(run_id, outputs=False)
    drawing = graph.draw(_items(detail))
    workers = await who.api.list_workers(include_inactive=True) if detail.attempts else ()
    recoveries = _recoveries(detail, workers)
    drawn = timeline.draw(
        detail.attempts,
        {w.id: w.name for w in workers},
        detail.run.created_at or datetime.now(UTC),
        detail.run.finished_at or datetime.now(UTC),
    )
    data = {
        "run": {"id": detail.run.id, "state": detail.run.state, "last_seq": detail.run.last_seq},
        "tasks": _task_rows(detail),
        "tasks_omitted": detail.tasks_omitted,
        **_graph_data(drawing),
        "states": TASK_STATES,
    }
    return page(
        request,
        who,
        "run.html",
        run=detail.run,
        tasks_omitted=detail.tasks_omitted,
        drawing=drawing,
        states=[t.state for t in detail.tasks.values()],
        data=data,
        recoveries=recoveries,
        recovery_summary=recovery.summary(recoveries),
        timeline=drawn,
        saved=detail.saved,
        **_actions(who, detail.run),
    )


def _recoveries(detail: RunDetail, workers: Sequence[Worker]) -> list[recovery.Recovery]:
    if not any(a.state == "interrupted" for a in detail.attempts):
        return []
    return recovery.recoveries(detail.attempts, {w.id: w for w in workers})


def _items(detail: RunDetail) -> list[graph.Item]:
    return [graph.Item(t.key, t.depends_on) for t in detail.tasks.values()]


def _actions(who: Caller, run: Run) -> dict[str, Any]:
    """What the run's buttons may offer this caller (the server checks again)."""
    return {
        "may_cancel": who.identity.may("CancelRun")
        and run.state == "running"
        and run.cancel_requested_at is None,
        "may_retry": who.identity.may("RetryRun") and run.state in TERMINAL_RUN_STATES,
        # One id per form shown: submitting it twice starts one run.
        "retry_request_id": secrets.token_hex(12),
    }


async def run_header(request: Request) -> Response:
    """The run's header again (state, audit, buttons): the page swaps it in when the run's
    state changes."""
    who = await caller(request)
    detail = await who.api.get_run(request.path_params["run_id"], outputs=False)
    return page(
        request,
        who,
        "run_header.html",
        run=detail.run,
        saved=detail.saved,
        **_actions(who, detail.run),
    )


async def run_graph(request: Request) -> Response:
    """The graph again with some fan-outs expanded: its SVG and which node shows each task."""
    who = await caller(request)
    detail = await who.api.get_run(request.path_params["run_id"], outputs=False)
    expand = [name for name in request.query_params.get("expand", "").split(",") if name]
    drawing = graph.draw(_items(detail), expand)
    template = console_of(request).templates.get_template("graph.html")
    states = [t.state for t in detail.tasks.values()]
    svg = template.module.drawing(drawing, states)  # type: ignore[attr-defined]
    return JSONResponse(
        {
            "svg": str(svg),
            **_graph_data(drawing),
            # The tasks drawn, as the page's data has them: a map's elements made since
            # the page loaded are among them.
            "tasks": _task_rows(detail),
            "tasks_omitted": detail.tasks_omitted,
            "too_large": drawing.too_large,
        }
    )


def _graph_data(drawing: graph.Drawing) -> dict[str, Any]:
    """What run.js needs of a drawing: which node shows each task, each node's kind, and
    the task a fan-out node shows as its map (-1: none)."""
    return {
        "node_of": drawing.node_of,
        "nodes": [n.kind for n in drawing.nodes],
        "parents": [n.parent for n in drawing.nodes],
    }


def _task_rows(detail: RunDetail) -> list[list[Any]]:
    """[key, state, attempt, max_attempts, free attempts]: run.js shows the charged ones
    (attempt - free, the rule of awp_protocol.states.charged_attempts) against the maximum,
    as the task panel does, and follows the attempt number live."""
    return [
        [t.key, t.state, t.attempts, t.max_attempts, t.attempts - t.charged_attempts]
        for t in detail.tasks.values()
    ]


async def task(request: Request) -> Response:
    who = await caller(request)
    run_id, key = request.path_params["run_id"], request.path_params["task_key"]
    shown, found = await api.get_task(who.api, run_id, key)
    if found is None:
        raise HTTPException(404, f"run {run_id} has no task {key!r}")
    workflow, attempts = await asyncio.gather(
        who.api.get_workflow(shown.workflow, shown.version),
        api.all_attempts(who.api, run_id, key),
    )
    definition = next((d for d in workflow.tasks if d.key == key), None)
    if definition is None and (name := graph.fanout_of(key)) is not None:
        definition = next((d for d in workflow.tasks if d.key == name), None)
    asked = asked_for_decision(found)
    decided = await who.api.decisions(run_id, task_key=key) if asked else []
    return page(
        request,
        who,
        "task.html",
        run=shown,
        task=found,
        definition=definition,
        attempts=attempts,
        error=shown_error(found, attempts),
        timeline=_timeline(attempts),
        may_decide=may_decide(who.identity, found.wait),
        decisions=decided,
        **_actions(who, shown),
    )


def may_decide(identity: Identity, wait: TaskWait | None) -> bool:
    """Whether the task panel offers this caller Approve and Reject (the server checks
    again): the task waits for an approval, the caller's role may decide, and it is an
    admin's when the wait asks for admins."""
    if wait is None or wait.kind is not CheckpointKind.APPROVAL or not identity.may("Approve"):
        return False
    return wait.role != Role.ADMIN or Role.ADMIN in identity.roles


def shown_error(task: TaskStatus, attempts: Sequence[Attempt]) -> TaskError | None:
    """The error a task's panel shows: its last attempt's, so a task that succeeded on a
    later attempt shows none (the earlier errors stay in its attempts). A task that never
    ran an attempt (a map task, one that failed before it ran) shows its own."""
    return attempts[-1].error if attempts else task.error


def _timeline(attempts: Sequence[Attempt]) -> list[tuple[Attempt, float, float]]:
    """(attempt, x, width) of each attempt's bar on a 0-100 scale of the task's time."""
    starts = [a.started_at for a in attempts if a.started_at is not None]
    if not starts:
        return []
    ends = [a.finished_at or a.deadline or a.started_at for a in attempts if a.started_at]
    first, last = min(starts), max(e for e in ends if e is not None)
    total = max((last - first).total_seconds(), 1e-3)
    bars = []
    for attempt in attempts:
        if attempt.started_at is None:
            continue
        end = attempt.finished_at or last
        x = (attempt.started_at - first).total_seconds() / total * 100
        width = max((end - attempt.started_at).total_seconds() / total * 100, 0.5)
        bars.append((attempt, round(x, 2), round(min(width, 100 - x), 2)))
    return bars


async def attempts(request: Request) -> Response:
    """One ListAttempts page of the run, for the run page's attempts table."""
    who = await caller(request)
    run_id = request.path_params["run_id"]
    token = request.query_params.get("page", "")
    found = await who.api.list_attempts_page(run_id, page_token=token)
    return page(
        request,
        who,
        "attempts.html",
        run_id=run_id,
        attempts=found.items,
        next=found.next_page_token,
    )


async def workflows(request: Request) -> Response:
    who = await caller(request)
    found = await who.api.list_workflows_page(page_token=request.query_params.get("page", ""))
    versions: dict[str, list[StoredWorkflow]] = defaultdict(list)
    for workflow in found.items:
        versions[workflow.name].append(workflow)
    return page(
        request,
        who,
        "workflows.html",
        versions=versions,
        next_token=found.next_page_token,
    )


async def workflow(request: Request) -> Response:
    who = await caller(request)
    name = request.path_params["name"]
    version = request.query_params.get("version", "0")
    if not version.isdigit():
        raise HTTPException(400, "version must be a whole number")
    shown, versions = await asyncio.gather(
        who.api.get_workflow(name, int(version)),
        who.api.list_workflows_page(name=name, page_size=1000),
    )
    drawing = graph.draw([graph.Item(t.key, t.depends_on) for t in shown.tasks])
    return page(
        request,
        who,
        "workflow.html",
        workflow=shown,
        versions=versions.items,
        drawing=drawing,
    )


async def workers(request: Request) -> Response:
    who = await caller(request)
    include = request.query_params.get("all") == "1"
    found = await who.api.list_workers(include_inactive=include)
    return page(request, who, "workers.html", workers=found, include_inactive=include)


async def schedules(request: Request) -> Response:
    who = await caller(request)
    found = await Schedules(who.api).list()
    return page(request, who, "schedules.html", schedules=found)


async def limits(request: Request) -> Response:
    who = await caller(request)
    found = await RateLimits(who.api).overview()
    return page(request, who, "limits.html", overview=found)
