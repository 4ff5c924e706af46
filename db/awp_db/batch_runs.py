"""StartRuns: many runs started in one transaction (batch enqueue; docs/design.md §4).

Each entry is what `runs.start` takes, and each ends as it would: a new run with all
its tasks, or, for a request_id used before, the run it started. The whole batch is a
handful of statements whatever its size: the runs in one INSERT, every task of every
new run in one (`runs.insert_tasks`), their events in one flush, one notification.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from awp_db import settle
from awp_db.connect import Conn
from awp_db.events import Event, EventBatch
from awp_db.queries import named, queries
from awp_db.runs import NewTasks, Start, StartedRun, insert_tasks
from awp_db.signals import RUN_STARTED
from awp_db.workflows import StoredWorkflow

Q = queries("runs")


@dataclass(frozen=True, slots=True)
class NewRun:
    workflow: StoredWorkflow
    run_input: dict[str, Any]
    request_id: str | None
    start: Start = Start()


async def start_many(conn: Conn, entries: Sequence[NewRun], started_by: str) -> list[StartedRun]:
    """Starts every entry's run in one transaction, or none (an input a concurrency key
    or rate-units template cannot render refuses them all). One answer per entry, in
    order; an entry whose request_id was taken answers that run, created False.

    The caller checks that no request_id repeats within the batch: two entries of one
    id would start one run, and the second's answer could not say which request won.
    """
    ids = [uuid.uuid4() for _ in entries]
    async with conn.transaction():
        inserted = {
            row["id"]: row["awaiting_start"]
            for row in await conn.fetch(
                *named(
                    Q["insert_many"],
                    started_by=started_by,
                    ids=ids,
                    workflow_ids=[e.workflow.id for e in entries],
                    inputs=[json.dumps(e.run_input) for e in entries],
                    concurrency=[e.workflow.spec.concurrency for e in entries],
                    request_ids=[e.request_id for e in entries],
                    start_at=[e.start.at for e in entries],
                    delay_ms=[e.start.delay_ms for e in entries],
                    trace_ids=[
                        e.start.trace.run.trace_id if e.start.trace else None for e in entries
                    ],
                    trace_spans=[
                        e.start.trace.run.span_id if e.start.trace else None for e in entries
                    ],
                    trace_parents=[
                        e.start.trace.caller_span if e.start.trace else None for e in entries
                    ],
                    priorities=[e.start.priority for e in entries],
                )
            )
        }
        taken = [
            e.request_id for run_id, e in zip(ids, entries, strict=True) if run_id not in inserted
        ]
        existing: dict[str, UUID] = (
            {row["request_id"]: row["id"] for row in await conn.fetch(Q["by_request_ids"], taken)}
            if taken
            else {}
        )
        created = [
            (run_id, e) for run_id, e in zip(ids, entries, strict=True) if run_id in inserted
        ]
        rows = await insert_tasks(
            conn,
            *(
                NewTasks(run_id, e.workflow.spec, e.run_input, inserted[run_id])
                for run_id, e in created
            ),
        )
        events = EventBatch()
        for run_id, e in created:
            spec = e.workflow.spec
            payload = {"workflow": spec.name, "version": spec.version, "by": started_by}
            events.add(Event(run_id, "run.created", to_state="running", payload=payload))
        for row in rows:
            events.task(row["run_id"], row["key"], None, row["state"])
        await events.flush(conn)
        if created:
            await settle.notify_coordinator(conn, RUN_STARTED)
    return [
        StartedRun(run_id, True)
        if run_id in inserted
        else StartedRun(existing[e.request_id or ""], False)
        for run_id, e in zip(ids, entries, strict=True)
    ]
