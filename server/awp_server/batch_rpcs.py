"""StartRuns: batch enqueue (docs/design.md §4, "Starting many runs"). Each entry is
checked exactly as StartRun checks its request; any error names its entry and stores
nothing (one transaction: awp_db.batch_runs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from awp.v1 import runs_pb2
from awp_db import batch_runs, runs, workflows
from awp_kernel.errors import AwpError, invalid
from awp_protocol.errors import FieldViolation, join_violations
from awp_server import control_requests as requests
from awp_server.auth import caller
from awp_server.control_service import Context, load_run
from awp_server.errors import unary
from awp_server.limit_rpcs import ControlServiceWithLimits


@contextlib.contextmanager
def _entry(index: int) -> Iterator[None]:
    """An entry's error, with its fields and message naming the entry (runs[i])."""
    where = f"runs[{index}]"
    try:
        yield
    except AwpError as exc:
        named = [FieldViolation(f"{where}.{v.field}", v.description) for v in exc.violations]
        message = join_violations(named) if named else f"{where}: {exc.message}"
        raise AwpError(exc.kind, exc.reason, message, named, exc.metadata) from None


class ControlServiceWithBatches(ControlServiceWithLimits):
    """ControlService with every group of RPCs: what awp-server serves."""

    @unary
    async def StartRuns(
        self, request: runs_pb2.StartRunsRequest, context: Context
    ) -> runs_pb2.StartRunsResponse:
        if not request.runs:
            raise invalid("runs", "give at least one run")
        entries: list[batch_runs.NewRun] = []
        first_of: dict[str, int] = {}
        found: dict[tuple[str, int], workflows.StoredWorkflow] = {}
        for index, entry in enumerate(request.runs):
            with _entry(index):
                run_input, start = requests.run_start(entry, context)
                if entry.request_id in first_of:
                    raise invalid("request_id", f"repeats runs[{first_of[entry.request_id]}]'s")
                if entry.request_id:
                    first_of[entry.request_id] = index
                which = (entry.workflow_name, entry.workflow_version)
                if which not in found:
                    found[which] = await workflows.get(self._pool, *which)
                runs.check_renderable(found[which].spec, run_input)
                entries.append(
                    batch_runs.NewRun(found[which], run_input, entry.request_id or None, start)
                )
        async with self._pool.acquire() as conn, conn.transaction():
            started = await batch_runs.start_many(conn, entries, caller())
            # A request_id used before must be the same request again; checked before
            # commit, so a conflict stores none of the batch.
            for index, (entry, new, one) in enumerate(
                zip(request.runs, entries, started, strict=True)
            ):
                if not one.created:
                    with _entry(index):
                        run = await load_run(conn, one.run_id)
                        requests.same_request(entry, new.run_input, run)
        created = sum(one.created for one in started)
        requests.audit("StartRuns", runs=len(started), new=created)
        return runs_pb2.StartRunsResponse(
            runs=[
                runs_pb2.StartedRun(run_id=str(one.run_id), created=one.created) for one in started
            ]
        )
