"""What a failed scenario's report shows: each process's log tail, and the database's
view of runs, tasks, leases and workers."""

from __future__ import annotations

import asyncio
import contextlib

from cluster import Cluster


def log_tails(cluster: Cluster, lines: int = 60) -> list[tuple[str, str]]:
    tails = [(p.name, p.tail(lines)) for p in cluster.processes.values()]
    if cluster.postgres is not None:
        with contextlib.suppress(OSError):
            text = cluster.postgres.log_file.read_text(errors="replace")
            tails.append(("postgres", "\n".join(text.splitlines()[-lines:])))
    return tails


async def snapshot(cluster: Cluster) -> str:
    """The database's view for a failure report: runs, tasks, live leases, workers."""
    queries = {
        "runs": "SELECT id, state, revision, last_seq, cancel_requested_at FROM runs",
        "tasks by state": "SELECT run_id, state, count(*) FROM tasks GROUP BY 1, 2 ORDER BY 1, 2",
        "unfinished tasks": "SELECT run_id, key, state, attempts, retry_at FROM tasks"
        " WHERE finished_at IS NULL ORDER BY id LIMIT 30",
        "live dispatches": "SELECT id, task_id, state, worker_id, lease_expires_at,"
        " clock_timestamp() AS now FROM dispatches WHERE state IN ('pending', 'leased')"
        " ORDER BY id LIMIT 30",
        "workers": "SELECT id, name, state, last_heartbeat_at, clock_timestamp() AS now"
        " FROM workers ORDER BY registered_at",
        "attempts by state": "SELECT state, count(*) FROM attempts GROUP BY 1",
    }
    lines = []
    for title, query in queries.items():
        lines.append(f"-- {title}")
        try:
            async with asyncio.timeout(5):
                rows = await cluster.fetch(query)
        except Exception as exc:
            lines.append(f"   (unavailable: {exc!r})")
            continue
        lines.extend("   " + ", ".join(f"{k}={v}" for k, v in row.items()) for row in rows)
    return "\n".join(lines)
