"""Dynamic work inside a run (docs/workflows.md): map tasks and their elements, the
downstream of a failure that lets the run continue, and always tasks.

Each function is one step of a settlement (awp_db.settle.end_attempts drives them): the
caller holds the locks of every run involved (awp_db.locks) and flushes the EventBatch.
A step that ends tasks returns them as `Finished`, so that their ends set off the next
step in the same transaction (a map task over an empty list succeeds at once, which may
start a map over its outputs, and so on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any
from uuid import UUID

from asyncpg import Record

from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_db.queries import queries, rows_as
from awp_protocol.errors import quote
from awp_protocol.limits import MAX_INPUT_BYTES, MAX_MAP_ELEMENTS, MAX_OUTPUT_BYTES
from awp_protocol.names import element_key
from awp_protocol.results import StoredError

Q = queries("dynamic")


@dataclass(frozen=True, slots=True)
class Finished:
    """A task that succeeded or failed for good in this transaction."""

    id: int
    run_id: UUID
    key: str
    state: str
    dependents: list[str]
    parent_id: int | None
    map_index: int | None
    on_failure: str
    always: bool
    error: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class MapTask:
    """A map task whose upstream has just succeeded (it is running, with no element yet)."""

    id: int
    run_id: UUID
    key: str


def _source_problem(row: Record) -> str | None:
    """Why the value a map task found cannot be mapped over (a map_sources row), or None."""
    where = f"map over {quote(row['map_over'])}: the value at {quote(row['path'])} in its output"
    json_type, size = row["type"], row["size"]
    if json_type is None:
        return f"{where} is missing (expected a list)"
    if json_type != "array":
        return f"{where} is {'null' if json_type == 'null' else f'a JSON {json_type}'}, not a list"
    if size > MAX_MAP_ELEMENTS:
        return f"{where} has {size} elements; a map task takes at most {MAX_MAP_ELEMENTS}"
    # An element's input travels in its lease, which must stay deliverable.
    if size and row["largest_input"] > MAX_INPUT_BYTES:
        return (
            f"{where} has an element that makes an input of {row['largest_input']} bytes "
            f"(the task's input, item and index); an input is at most {MAX_INPUT_BYTES}"
        )
    return None


async def start_maps(conn: Conn, started: Sequence[MapTask], events: EventBatch) -> list[Finished]:
    """Creates the elements of map tasks whose upstream has succeeded, READY.

    A map task over an empty list succeeds at once; one whose value is missing, not a
    list, longer than MAX_MAP_ELEMENTS or with an element too large for an input fails,
    with an error saying which. Both are returned.
    """
    if not started:
        return []
    parents: list[int] = []
    keys: list[str] = []
    indexes: list[int] = []
    empty: list[int] = []
    refused: list[tuple[int, str]] = []
    for row in await conn.fetch(Q["map_sources"], [task.id for task in started]):
        problem = _source_problem(row)
        if problem is not None:
            refused.append((row["id"], problem))
        elif row["size"] == 0:
            empty.append(row["id"])
        else:
            for index in range(row["size"]):
                parents.append(row["id"])
                keys.append(element_key(row["key"], index))
                indexes.append(index)
    if parents:
        for row in await conn.fetch(Q["expand_maps"], parents, keys, indexes):
            events.task(row["run_id"], row["key"], None, "ready")
    return [
        *await _fail(conn, refused, events),
        *await _succeed(conn, empty, events),
    ]


async def elements_ended(
    conn: Conn, elements: Sequence[Finished], events: EventBatch
) -> list[Finished]:
    """Map tasks settled by their elements' ends: one element failing for good fails its
    map task (its other elements are stopped); the last one succeeding makes it succeed
    with their outputs in order. Returns the map tasks that ended."""
    failed: dict[int, str] = {}
    for element in elements:
        if element.state == "failed" and element.parent_id is not None:
            message = (element.error or {}).get("message") or "failed"
            failed.setdefault(
                element.parent_id, f"element {element.map_index} ({element.key}) failed: {message}"
            )
    ended = await _fail(conn, list(failed.items()), events)
    # Those map tasks have failed: their other elements will never be needed.
    await stop_elements(conn, [task.id for task in ended], events)
    counted = [
        element.parent_id
        for element in elements
        if element.state == "succeeded" and element.parent_id is not None
    ]
    if counted:
        complete = [
            row["id"]
            for row in await conn.fetch(Q["count_down"], counted)
            if row["elements_left"] == 0
        ]
        ended.extend(await _succeed(conn, complete, events))
    return ended


async def _succeed(conn: Conn, map_ids: Sequence[int], events: EventBatch) -> list[Finished]:
    """Map tasks with every element succeeded: each succeeds with their outputs in order,
    or fails if those together are larger than any task's output may be (MAX_OUTPUT_BYTES)."""
    if not map_ids:
        return []
    succeeded: list[Finished] = []
    too_large: list[tuple[int, str]] = []
    for row in await conn.fetch(Q["succeed_maps"], list(map_ids), MAX_OUTPUT_BYTES):
        if row["succeeded"]:
            task = Finished(**{f.name: row[f.name] for f in fields(Finished)})
            events.task(task.run_id, task.key, "running", "succeeded")
            succeeded.append(task)
        else:
            too_large.append(
                (
                    row["id"],
                    f"the outputs of its elements come to {row['bytes']} bytes of JSON; "
                    f"a task's output is at most {MAX_OUTPUT_BYTES} bytes",
                )
            )
    return [*succeeded, *await _fail(conn, too_large, events)]


async def _fail(
    conn: Conn, failures: Sequence[tuple[int, str]], events: EventBatch
) -> list[Finished]:
    """Running map tasks fail for good, each with its reason."""
    if not failures:
        return []
    ended = await rows_as(
        Finished,
        conn,
        Q["fail_tasks"],
        [task_id for task_id, _ in failures],
        [json.dumps(StoredError(why, retryable=False).to_json()) for _, why in failures],
    )
    for task in ended:
        events.task(task.run_id, task.key, "running", "failed", payload={"error": task.error})
    return ended


async def stop_elements(conn: Conn, map_ids: Sequence[int], events: EventBatch) -> None:
    """The unfinished elements of these map tasks end: live leases are revoked, a running
    element is canceled with its attempt, the others are skipped."""
    if not map_ids:
        return
    await conn.execute(Q["cancel_element_dispatches"], list(map_ids))
    for row in await conn.fetch(Q["cancel_element_attempts"], list(map_ids)):
        events.attempt(row["run_id"], row["key"], row["attempt"], "running", "canceled")
    for row in await conn.fetch(Q["stop_elements"], list(map_ids)):
        events.task(row["run_id"], row["key"], row["from_state"], row["to_state"])


async def skip_downstream(conn: Conn, failed: Iterable[Finished], events: EventBatch) -> None:
    """Every task downstream of these failed tasks is skipped: it can never run."""
    task_ids = [task.id for task in failed]
    if task_ids:
        for row in await conn.fetch(Q["skip_downstream"], task_ids):
            events.task(row["run_id"], row["key"], "pending", "skipped")


async def release_always(conn: Conn, run_ids: Sequence[UUID], events: EventBatch) -> int:
    """The always tasks of these runs whose turn has come become ready: every other task
    is terminal, and so is every always task they depend on."""
    if not run_ids:
        return 0
    rows = await conn.fetch(Q["release_always"], list(run_ids))
    for row in rows:
        events.task(row["run_id"], row["key"], "pending", "ready")
    return len(rows)
