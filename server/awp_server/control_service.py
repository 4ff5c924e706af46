"""ControlService: workflows, runs, their events, workers and stats (DESIGN.md §5).

Handlers validate input (text, counts and durations of every request are checked before
them: awp_server.guard), call the storage layer (awp_db) and convert rows to
messages (awp_server.convert); no SQL and no lifecycle rule lives here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import grpc

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, streams_pb2, types_pb2
from awp_db import (
    attempts,
    events,
    grant,
    outputs,
    reads,
    retention,
    retry,
    runs,
    stats,
    workers,
    workflows,
)
from awp_db.connect import Conn, Pool
from awp_db.listen import Listener
from awp_db.signals import RUN_EVENTS_CHANNEL
from awp_kernel.definition_proto import spec_from_proto
from awp_kernel.errors import invalid
from awp_protocol.errors import quote
from awp_protocol.jsonvalue import canonical_json
from awp_protocol.limits import (
    MAX_ATTEMPTS_PAGE_SIZE,
    MAX_GET_RUN_ROWS,
    MAX_PAGE_SIZE,
    MAX_PRUNE_RUNS,
    MAX_SEQ,
    MAX_STREAM_READERS_PER_SERVER,
    MAX_VERSION,
)
from awp_protocol.names import NAME_PATTERN, TASK_KEY_PATTERN, TASK_KEY_RULE
from awp_protocol.roles import Role
from awp_protocol.states import TERMINAL_RUN_STATES
from awp_server import control_requests as requests
from awp_server import convert, delivery
from awp_server.auth import caller, caller_credential
from awp_server.errors import server_stream, unary
from awp_server.streams import StreamReaders

Context = grpc.aio.ServicerContext[Any, Any]

WORKFLOWS_PAGE: Final = (100, MAX_PAGE_SIZE)  # (default, max) page size
RUNS_PAGE: Final = (50, MAX_PAGE_SIZE)
ATTEMPTS_PAGE: Final = (MAX_ATTEMPTS_PAGE_SIZE, MAX_ATTEMPTS_PAGE_SIZE)
TASKS_PAGE: Final = (MAX_PAGE_SIZE, MAX_PAGE_SIZE)
PRUNE_CALL: Final = (1000, MAX_PRUNE_RUNS)  # (default, max) runs per PruneRuns
# Events read per query while catching a watcher up.
WATCH_BATCH: Final = 500
# Even with a notification lost, a watcher re-reads the database this often.
WATCH_POLL_S: Final = 1.0


class ControlService(control_pb2_grpc.ControlServiceServicer):
    def __init__(
        self,
        pool: Pool,
        listener: Listener,
        *,
        watch_poll_s: float = WATCH_POLL_S,
        max_stream_readers: int = MAX_STREAM_READERS_PER_SERVER,
    ):
        self._pool = pool
        self._listener = listener
        self._watch_poll_s = watch_poll_s
        self.stream_readers = StreamReaders(pool, listener, watch_poll_s, max_stream_readers)

    # ------------------------------------------------------------ workflows

    @unary
    async def CreateWorkflow(
        self, request: control_pb2.CreateWorkflowRequest, context: Context
    ) -> control_pb2.CreateWorkflowResponse:
        spec = spec_from_proto(request.definition)
        stored, created = await workflows.create(self._pool, spec)
        requests.audit("CreateWorkflow", workflow=spec.name, version=spec.version, new=created)
        return control_pb2.CreateWorkflowResponse(
            workflow=convert.workflow_to_proto(stored), created=created
        )

    @unary
    async def GetWorkflow(
        self, request: control_pb2.GetWorkflowRequest, context: Context
    ) -> control_pb2.GetWorkflowResponse:
        requests.check_name("name", request.name)
        requests.check_version("version", request.version)
        stored = await workflows.get(self._pool, request.name, request.version)
        return control_pb2.GetWorkflowResponse(workflow=convert.workflow_to_proto(stored))

    @unary
    async def ListWorkflows(
        self, request: control_pb2.ListWorkflowsRequest, context: Context
    ) -> control_pb2.ListWorkflowsResponse:
        if request.name:
            requests.check_name("name", request.name)
        size = requests.page_size(request.page_size, *WORKFLOWS_PAGE)
        after: tuple[str, int] = ("", 0)  # sorts before every (name, version)
        if request.page_token:
            name, version = requests.decode_token(request.page_token, "w", (str, int))
            if not NAME_PATTERN.fullmatch(name) or not 1 <= version <= MAX_VERSION:
                raise requests.bad_token()
            after = (name, version)
        found = await workflows.list_page(self._pool, request.name or None, after, size + 1)
        page = found[:size]
        next_token = ""
        if len(found) > size:
            last = page[-1].spec
            next_token = requests.encode_token("w", [last.name, last.version])
        return control_pb2.ListWorkflowsResponse(
            workflows=[convert.workflow_to_proto(w) for w in page], next_page_token=next_token
        )

    # ------------------------------------------------------------ runs

    @unary
    async def StartRun(
        self, request: runs_pb2.StartRunRequest, context: Context
    ) -> runs_pb2.StartRunResponse:
        run_input, start = requests.run_start(request, context)
        workflow = await workflows.get(self._pool, request.workflow_name, request.workflow_version)
        async with self._pool.acquire() as conn:
            started = await runs.start(
                conn, workflow, run_input, request.request_id or None, caller(), start=start
            )
            run = await load_run(conn, started.run_id)
        if not started.created:
            requests.same_request(request, run_input, run)
        requests.audit("StartRun", run_id=run.id, new=started.created)
        return runs_pb2.StartRunResponse(run=run, created=started.created)

    @unary
    async def GetRun(
        self, request: runs_pb2.GetRunRequest, context: Context
    ) -> runs_pb2.GetRunResponse:
        run_id = runs.parse_run_id(request.run_id)
        # One snapshot: the counts, tasks, attempts and revision all agree.
        async with reads.snapshot(self._pool) as conn:
            run_row = await runs.get(conn, run_id)
            counts = (await runs.task_counts(conn, [run_id])).get(run_id, {})
            task_rows = await runs.tasks(conn, run_id, limit=MAX_GET_RUN_ROWS)
            attempt_rows = await runs.attempts(conn, run_id, limit=MAX_GET_RUN_ROWS)
            unlisted_attempts = 0
            if len(attempt_rows) == MAX_GET_RUN_ROWS:
                unlisted_attempts = await runs.attempt_count(conn, run_id) - MAX_GET_RUN_ROWS
            tracebacks = await attempts.final_tracebacks(
                conn, run_id, [row.id for row in task_rows]
            )
            waiting = counts.get("ready") or counts.get("queued")
            held_back = await grant.explain(conn, run_id) if waiting else {}
        answer = runs_pb2.GetRunResponse(
            run=convert.run_to_proto(run_row, counts),
            tasks=[
                convert.task_to_proto(row, tracebacks.get(row.key), held_back.get(row.key, ""))
                for row in task_rows
            ],
            attempts=[convert.attempt_to_proto(row) for row in attempt_rows],
            tasks_omitted=sum(counts.values()) - len(task_rows),
            attempts_omitted=unlisted_attempts,
        )
        delivery.trim_run(answer)
        return answer

    @unary
    async def ListTasks(
        self, request: runs_pb2.ListTasksRequest, context: Context
    ) -> runs_pb2.ListTasksResponse:
        run_id = runs.parse_run_id(request.run_id)
        size = requests.page_size(request.page_size, *TASKS_PAGE)
        after = requests.after_id(request.page_token, "t")
        async with reads.snapshot(self._pool) as conn:
            await runs.get(conn, run_id)  # RUN_NOT_FOUND before an empty page
            found = await runs.tasks(conn, run_id, after=after, limit=size + 1)
            page = found[:size]
            tracebacks = await attempts.final_tracebacks(conn, run_id, [row.id for row in page])
        answer = runs_pb2.ListTasksResponse(
            tasks=[convert.task_to_proto(row, tracebacks.get(row.key)) for row in page]
        )
        delivery.trim_tasks(answer)
        kept = len(answer.tasks)
        if kept < len(page) or len(found) > size:
            answer.next_page_token = requests.encode_token("t", [page[kept - 1].id])
        return answer

    @unary
    async def GetTaskOutput(
        self, request: runs_pb2.GetTaskOutputRequest, context: Context
    ) -> runs_pb2.GetTaskOutputResponse:
        run_id = runs.parse_run_id(request.run_id)
        async with reads.snapshot(self._pool) as conn:
            await runs.get(conn, run_id)  # RUN_NOT_FOUND first
            output = await outputs.task_output(conn, run_id, request.task_key)
        return runs_pb2.GetTaskOutputResponse(
            output_json="" if output is None else canonical_json(output).decode()
        )

    @unary
    async def ListAttempts(
        self, request: runs_pb2.ListAttemptsRequest, context: Context
    ) -> runs_pb2.ListAttemptsResponse:
        run_id = runs.parse_run_id(request.run_id)
        task_key = request.task_key or None
        size = requests.page_size(request.page_size, *ATTEMPTS_PAGE)
        after = requests.after_id(request.page_token, "a")
        async with reads.snapshot(self._pool) as conn:
            await runs.get(conn, run_id)  # RUN_NOT_FOUND before an empty page
            if task_key is not None and not await attempts.has_task(conn, run_id, task_key):
                raise invalid("task_key", f"run {run_id} has no task {quote(task_key)}")
            found = await attempts.page(conn, run_id, task_key, after, size + 1)
        page = found[:size]
        return runs_pb2.ListAttemptsResponse(
            attempts=[convert.attempt_detail_to_proto(row) for row in page],
            next_page_token=requests.encode_token("a", [page[-1].id]) if len(found) > size else "",
        )

    @unary
    async def ListRuns(
        self, request: runs_pb2.ListRunsRequest, context: Context
    ) -> runs_pb2.ListRunsResponse:
        if request.workflow_name:
            requests.check_name("workflow_name", request.workflow_name)
        state: str | None = None
        if request.state != types_pb2.RUN_STATE_UNSPECIFIED:
            state = convert.RUN_STATES.name(request.state)
            if state is None:
                raise invalid("state", f"unknown run state {request.state}")
        size = requests.page_size(request.page_size, *RUNS_PAGE)
        before: tuple[datetime, UUID] | None = None
        if request.page_token:
            created_at, run_id = requests.decode_token(request.page_token, "r", (str, str))
            try:
                before = (datetime.fromisoformat(created_at), UUID(run_id))
            except ValueError:
                raise requests.bad_token() from None
            if before[0].tzinfo is None:
                raise requests.bad_token()
        async with reads.snapshot(self._pool) as conn:
            found = await runs.list_page(
                conn, request.workflow_name or None, state, before, size + 1
            )
            page = found[:size]
            counts = await runs.task_counts(conn, [row.id for row in page])
        next_token = ""
        if len(found) > size:
            last = page[-1]
            next_token = requests.encode_token("r", [last.created_at.isoformat(), str(last.id)])
        return runs_pb2.ListRunsResponse(
            runs=[convert.run_to_proto(row, counts[row.id]) for row in page],
            next_page_token=next_token,
        )

    @unary
    async def CancelRun(
        self, request: runs_pb2.CancelRunRequest, context: Context
    ) -> runs_pb2.CancelRunResponse:
        run_id = runs.parse_run_id(request.run_id)
        async with self._pool.acquire() as conn:
            # False for a finished (or already canceling) run: nothing to do, not an error.
            recorded = await runs.request_cancel(conn, run_id, request.reason, caller())
            run = await load_run(conn, run_id)
        requests.audit("CancelRun", run_id=str(run_id), recorded=recorded)
        return runs_pb2.CancelRunResponse(run=run)

    @unary
    async def RetryRun(
        self, request: runs_pb2.RetryRunRequest, context: Context
    ) -> runs_pb2.RetryRunResponse:
        source = runs.parse_run_id(request.run_id)
        if request.from_task and not TASK_KEY_PATTERN.fullmatch(request.from_task):
            raise invalid("from_task", f"must be {TASK_KEY_RULE}")
        async with self._pool.acquire() as conn:
            started = await retry.retry(
                conn,
                retry.RetryRequest(
                    source, request.from_task or None, request.request_id or None, caller()
                ),
            )
            run = await load_run(conn, started.run_id)
        requests.audit(
            "RetryRun",
            run_id=run.id,
            retried_from=str(source),
            from_task=request.from_task,
            new=started.created,
        )
        return runs_pb2.RetryRunResponse(run=run, created=started.created)

    @server_stream
    async def WatchRun(
        self, request: runs_pb2.WatchRunRequest, context: Context
    ) -> AsyncIterator[runs_pb2.WatchRunResponse]:
        run_id = runs.parse_run_id(request.run_id)
        if request.after_seq > MAX_SEQ:
            raise invalid("after_seq", f"must be at most {MAX_SEQ}")
        sent = request.after_seq
        # Subscribe before the first read: a change committed between a read and the
        # wait still sets the waiter, so the wait returns at once instead of missing it.
        async with self._listener.subscribe(RUN_EVENTS_CHANNEL, key=str(run_id)) as waiter:
            while True:
                # The run's progress is read before its events: if it is terminal here,
                # every event up to last_seq is already committed and the reads below see it.
                state, last_seq = await runs.progress(self._pool, run_id)
                while True:
                    rows = await events.after_seq(self._pool, run_id, sent, WATCH_BATCH)
                    for row in rows:
                        yield runs_pb2.WatchRunResponse(event=convert.event_to_proto(row))
                        sent = row.seq
                    if len(rows) < WATCH_BATCH:
                        break
                if state in TERMINAL_RUN_STATES and sent >= last_seq:
                    return
                # Woken by a notification, or re-read anyway in case one was lost.
                await waiter.wait(self._watch_poll_s)

    @server_stream
    async def WatchStream(
        self, request: streams_pb2.WatchStreamRequest, context: Context
    ) -> AsyncIterator[streams_pb2.WatchStreamResponse]:
        async for response in self.stream_readers.watch(request):
            yield response

    # ------------------------------------------------------------ fleet

    @unary
    async def ListWorkers(
        self, request: control_pb2.ListWorkersRequest, context: Context
    ) -> control_pb2.ListWorkersResponse:
        rows = await workers.list_workers(self._pool, request.include_inactive)
        return control_pb2.ListWorkersResponse(workers=[convert.worker_to_proto(r) for r in rows])

    @unary
    async def GetStats(
        self, request: control_pb2.GetStatsRequest, context: Context
    ) -> control_pb2.GetStatsResponse:
        return convert.stats_to_proto(await stats.snapshot(self._pool))

    # ------------------------------------------------------------ retention

    @unary
    async def PruneRuns(
        self, request: control_pb2.PruneRunsRequest, context: Context
    ) -> control_pb2.PruneRunsResponse:
        older_than_s = request.older_than.ToTimedelta().total_seconds()
        if older_than_s <= 0:
            raise invalid("older_than", "must be more than 0, e.g. 7 days")
        limit = requests.page_size(request.limit, *PRUNE_CALL)
        if request.page_token and not request.dry_run:
            raise invalid("page_token", "only a dry run pages: a prune deletes what it counted")
        after: retention.Position | None = None
        async with self._pool.acquire() as conn:
            if request.page_token:
                # A dry run keeps the cutoff of its first page: its pages add up.
                cutoff, finished_at, run_id = requests.decode_token(
                    request.page_token, "p", (str, str, str)
                )
                try:
                    before = datetime.fromisoformat(cutoff)
                    after = (datetime.fromisoformat(finished_at), UUID(run_id))
                except ValueError:
                    raise requests.bad_token() from None
                if before.tzinfo is None or after[0].tzinfo is None:
                    raise requests.bad_token()
            else:
                before = await retention.cutoff(conn, older_than_s)
            next_token = ""
            if request.dry_run:
                survey = await retention.survey(conn, before, after, limit)
                counted, last = survey.would, survey.last
                remaining = 0 if last is None else await retention.backlog(conn, before, last)
                if remaining and last is not None:
                    next_token = requests.encode_token(
                        "p", [before.isoformat(), last[0].isoformat(), str(last[1])]
                    )
            else:
                counted = await retention.prune(conn, before, limit)
                remaining = await retention.backlog(conn, before)
        if not request.dry_run:
            requests.audit(
                "PruneRuns",
                older_than_s=older_than_s,
                remaining=remaining,
                **counted.by_table(),
            )
        return control_pb2.PruneRunsResponse(
            runs=counted.runs,
            tasks=counted.tasks,
            attempts=counted.attempts,
            dispatches=counted.dispatches,
            events=counted.state_events,
            remaining=remaining,
            cutoff=convert.timestamp(before),
            next_page_token=next_token,
        )

    # ------------------------------------------------------------ identity

    @unary
    async def WhoAmI(
        self, request: control_pb2.WhoAmIRequest, context: Context
    ) -> control_pb2.WhoAmIResponse:
        credential = caller_credential()
        if credential is None:  # no credentials: anyone may make every call
            return control_pb2.WhoAmIResponse(name=caller(), roles=sorted(Role))
        return control_pb2.WhoAmIResponse(
            name=credential.name, roles=sorted(credential.roles), credentials_required=True
        )


async def load_run(conn: Conn, run_id: UUID) -> runs_pb2.Run:
    row = await runs.get(conn, run_id)
    counts = await runs.task_counts(conn, [run_id])
    return convert.run_to_proto(row, counts[run_id])
