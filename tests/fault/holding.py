"""holder.py started as one of a scenario's processes, and the secrets it reveals."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import WORKER_TOKEN, Cluster, wait_for
from process import TESTS, Process


@dataclass(frozen=True, slots=True)
class HeldLease:
    """What holder.py reveals: enough to replay its calls after it died."""

    worker_id: str
    session_token: str
    dispatch_id: int
    lease_token: str
    fencing_token: int
    run_id: str
    task_key: str


async def start_holder(
    cluster: Cluster, name: str, *, within: float = 20.0
) -> tuple[Process, HeldLease]:
    """Starts holder.py (a worker that tells its secrets); returns once it holds a lease."""
    process = cluster.add(
        name,
        [sys.executable, str(Path(__file__).with_name("holder.py")), cluster.server_address,
         WORKER_TOKEN, name],
        # holder.py is a test script, not a console script: it needs the kit.
        {**cluster.env, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    process.spawn()

    async def holding() -> dict[str, Any] | None:
        if not process.alive:
            raise AssertionError(f"{name} exited early:\n{process.tail()}")
        return next((line for line in process.json_lines() if line.get("holding")), None)

    line = await wait_for(holding, f"{name} to hold a lease", within=within)
    return process, HeldLease(**{k: v for k, v in line.items() if k != "holding"})
