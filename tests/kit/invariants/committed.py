"""What holds in every committed state, over the whole database: the concurrency limits,
each task agreeing with its dispatches and attempts, each map task with its elements,
every run's event log, nothing live in a finished run, nothing leased to a gone worker,
every output stream's fencing and offsets (streams.py), the checkpoint rules
(checkpoints.py), the wait and signal rules (waits.py), the schedule rules
(schedules.py), the concurrency keys (flow.py) and the priorities (priorities.py)."""

from __future__ import annotations

from uuid import UUID

from kit.invariants.checkpoints import checkpoint_problems
from kit.invariants.common import Db
from kit.invariants.flow import flow_problems
from kit.invariants.placement import placement_problems
from kit.invariants.priorities import priority_problems
from kit.invariants.schedules import schedule_problems
from kit.invariants.streams import stream_problems
from kit.invariants.traces import trace_problems
from kit.invariants.waits import wait_problems


async def committed(conn: Db, global_limit: int = 0) -> tuple[list[str], dict[str, int]]:
    counts = dict(
        await conn.fetchrow(
            """SELECT count(*) FILTER (WHERE state IN ('pending', 'leased')) AS live,
                      count(*) FILTER (WHERE state = 'leased') AS leased
                 FROM dispatches"""
        )
    )
    problems = []
    if global_limit and counts["live"] > global_limit:
        problems.append(f"{counts['live']} live dispatches over the limit {global_limit}")
    problems.extend(await _limits(conn))
    problems.extend(await _tasks_agree_with_dispatches(conn))
    problems.extend(await _maps_agree_with_elements(conn))
    problems.extend(await _leased_to_gone_workers(conn))
    problems.extend(await stream_problems(conn))
    problems.extend(await checkpoint_problems(conn))
    problems.extend(await wait_problems(conn))
    problems.extend(await schedule_problems(conn))
    problems.extend(await trace_problems(conn))
    problems.extend(await flow_problems(conn))
    problems.extend(await priority_problems(conn))
    problems.extend(await placement_problems(conn))
    for run in await conn.fetch("SELECT id FROM runs ORDER BY id"):
        problems.extend(await _event_log(conn, run["id"]))
        problems.extend(await _nothing_live(conn, run["id"]))
    return problems, counts


async def _limits(conn: Db) -> list[str]:
    problems = []
    over = await conn.fetch(
        """SELECT r.id, r.concurrency, count(t.id) AS n
             FROM runs r JOIN tasks t ON t.run_id = r.id
            WHERE r.concurrency > 0 AND t.state IN ('queued', 'running') AND t.map_over IS NULL
            GROUP BY r.id HAVING count(t.id) > r.concurrency"""
    )
    if over:
        problems.append(f"runs over their concurrency: {[dict(r) for r in over]}")
    busy = await conn.fetch(
        """SELECT w.id, w.max_concurrency, count(d.id) AS n
             FROM workers w JOIN dispatches d ON d.worker_id = w.id AND d.state = 'leased'
            GROUP BY w.id HAVING count(d.id) > w.max_concurrency"""
    )
    if busy:
        problems.append(f"workers over max_concurrency: {[dict(r) for r in busy]}")
    return problems


async def _tasks_agree_with_dispatches(conn: Db) -> list[str]:
    """A queued task has one pending dispatch; a running one a leased dispatch and a
    running attempt (but a map task: its elements run); any other, neither. Its attempt
    counter counts its attempt rows."""
    problems = []
    for row in await conn.fetch(
        """SELECT t.id, t.state,
                  (SELECT count(*) FROM dispatches d
                    WHERE d.task_id = t.id AND d.state = 'pending') AS pending,
                  (SELECT count(*) FROM dispatches d
                    WHERE d.task_id = t.id AND d.state = 'leased') AS leased,
                  (SELECT count(*) FROM attempts a
                    WHERE a.task_id = t.id AND a.state = 'running') AS running,
                  (SELECT count(*) FROM attempts a WHERE a.task_id = t.id) AS attempts,
                  t.attempts AS counted, t.map_over IS NOT NULL AS is_map
             FROM tasks t"""
    ):
        expected = {"queued": (1, 0, 0), "running": (0, 1, 1)}.get(row["state"], (0, 0, 0))
        if row["is_map"]:
            expected = (0, 0, 0)
        got = (row["pending"], row["leased"], row["running"])
        if got != expected:
            problems.append(f"task {row['id']} {row['state']}: {got} != {expected}")
        if row["attempts"] != row["counted"]:
            problems.append(f"task {row['id']} attempts mismatch")
    return problems


async def _maps_agree_with_elements(conn: Db) -> list[str]:
    """A map task that has started has exactly map_size elements, keyed "<key>[i]" with
    indexes 0..n-1 and its input plus the element; while running, elements_left counts
    those not succeeded; succeeded, every element did and its output is theirs in order;
    ended any other way, none of them is still live. Elements exist only for a started
    map task."""
    problems = []
    for row in await conn.fetch(
        """SELECT m.key, m.state, m.map_size, m.elements_left,
                  count(e.id) AS n,
                  count(e.id) FILTER (WHERE e.key = m.key || '[' || e.map_index || ']'
                                        AND e.input - 'item' - 'index' = m.input
                                        AND (e.input -> 'index')::int = e.map_index) AS well_made,
                  count(DISTINCT e.map_index) AS indexes, max(e.map_index) AS top,
                  count(e.id) FILTER (WHERE e.state <> 'succeeded') AS unsucceeded,
                  count(e.id) FILTER (WHERE e.state IN ('pending', 'ready', 'queued', 'running',
                                                        'waiting_retry')) AS live,
                  m.output IS NOT DISTINCT FROM jsonb_build_object(
                      'outputs', coalesce(jsonb_agg(e.output ORDER BY e.map_index)
                                          FILTER (WHERE e.id IS NOT NULL), '[]')) AS combined
             FROM tasks m LEFT JOIN tasks e ON e.parent_id = m.id
            WHERE m.map_over IS NOT NULL
            GROUP BY m.id"""
    ):
        what = f"map task {row['key']} ({row['state']})"
        if row["map_size"] is None:
            if row["n"]:
                problems.append(f"{what}: {row['n']} elements but never started")
            continue
        if not row["n"] == row["indexes"] == row["well_made"] == row["map_size"] or (
            row["n"] and row["top"] != row["n"] - 1
        ):
            problems.append(
                f"{what}: map_size {row['map_size']} but {row['n']} elements, "
                f"{row['indexes']} indexes up to {row['top']}, {row['well_made']} well made"
            )
        if row["state"] == "running" and row["elements_left"] != row["unsucceeded"]:
            problems.append(
                f"{what}: elements_left {row['elements_left']} but "
                f"{row['unsucceeded']} elements not succeeded"
            )
        if row["state"] == "succeeded" and (row["unsucceeded"] or not row["combined"]):
            problems.append(f"{what}: its output is not its elements' outputs in order")
        if row["state"] not in ("running", "succeeded") and row["live"]:
            problems.append(f"{what}: {row['live']} elements still live")
    orphans = await conn.fetchval(
        """SELECT count(*) FROM tasks e JOIN tasks m ON m.id = e.parent_id
            WHERE m.map_size IS NULL OR e.run_id <> m.run_id"""
    )
    if orphans:
        problems.append(f"{orphans} elements of a map task that never started")
    return problems


async def _event_log(conn: Db, run_id: UUID) -> list[str]:
    row = await conn.fetchrow(
        """
        SELECT r.revision, r.last_seq,
               count(e.seq) AS events, min(e.seq) AS first_seq, max(e.seq) AS max_seq,
               count(DISTINCT e.revision) AS revisions, min(e.revision) AS first_revision,
               max(e.revision) AS max_revision
          FROM runs r LEFT JOIN state_events e ON e.run_id = r.id
         WHERE r.id = $1
         GROUP BY r.id
        """,
        run_id,
    )
    if row is None:
        return []
    problems = []
    if row["events"] != row["last_seq"] or (
        row["events"] and (row["first_seq"] != 1 or row["max_seq"] != row["last_seq"])
    ):
        problems.append(
            f"event seqs are not 1..{row['last_seq']}: {row['events']} events, "
            f"seq {row['first_seq']}..{row['max_seq']}"
        )
    if (
        row["max_revision"] != row["revision"]
        or row["revisions"] != row["revision"]
        or (row["revisions"] and row["first_revision"] != 1)
    ):
        problems.append(
            f"revisions are not 1..{row['revision']}: {row['revisions']} distinct, "
            f"{row['first_revision']}..{row['max_revision']}"
        )
    backwards = await conn.fetchval(
        """
        SELECT count(*) FROM (
            SELECT revision < lag(revision) OVER (ORDER BY seq) AS back
              FROM state_events WHERE run_id = $1) x
         WHERE back
        """,
        run_id,
    )
    if backwards:
        problems.append(f"revision decreases {backwards} time(s) along seq")
    return problems


async def _nothing_live(conn: Db, run_id: UUID) -> list[str]:
    row = await conn.fetchrow(
        """
        SELECT r.state,
               (SELECT count(*) FROM dispatches d
                 WHERE d.run_id = r.id AND d.state IN ('pending', 'leased')) AS live_dispatches,
               (SELECT count(*) FROM attempts a
                 WHERE a.run_id = r.id AND a.state = 'running') AS running_attempts,
               (SELECT count(*) FROM tasks t
                 WHERE t.run_id = r.id
                   AND t.state IN ('pending', 'ready', 'queued', 'running', 'waiting_retry'))
                 AS live_tasks
          FROM runs r WHERE r.id = $1
        """,
        run_id,
    )
    if row is None or row["state"] == "running":
        return []
    problems = []
    if row["live_dispatches"]:
        problems.append(f"run is {row['state']} but {row['live_dispatches']} dispatches are live")
    if row["running_attempts"]:
        problems.append(f"run is {row['state']} but {row['running_attempts']} attempts run")
    if row["live_tasks"]:
        problems.append(f"run is {row['state']} but {row['live_tasks']} tasks are live")
    return problems


async def _leased_to_gone_workers(conn: Db) -> list[str]:
    rows = await conn.fetch(
        """
        SELECT d.id, w.name, w.state
          FROM dispatches d JOIN workers w ON w.id = d.worker_id
         WHERE d.state = 'leased' AND w.state IN ('stopped', 'offline')
        """
    )
    return [
        f"dispatch {row['id']} is still leased to {row['state']} worker {row['name']}"
        for row in rows
    ]
