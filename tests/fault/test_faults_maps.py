"""Fault scenario 14, over real processes: a map task over 200 elements, one of its two
workers killed (kill -9) half-way through.

Every element is its own task with its own leases: the dead worker's elements are
interrupted and run again on the other worker, each element ends with exactly one
accepted result (kit.invariants), and the map task's downstream receives the 200
outputs in list order. Figures: elements re-executed, kill -> every interrupted element
running again, kill -> run succeeded.
"""

from __future__ import annotations

import json

import pytest
import workload
from cluster import Cluster
from figures import report_figure
from probes import seconds_between, wait_run, wait_succeeded
from victims import kill_holding

from kit.invariants import Expect

pytestmark = pytest.mark.fault

ELEMENTS = 200
ELEMENT_MS = 150


async def test_a_map_over_200_survives_a_worker_kill(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    victim = await cluster.start_worker("w1", concurrency=8)
    await cluster.start_worker("w2", concurrency=8)
    queries = [f"query {i}" for i in range(ELEMENTS)]
    # The mock executor echoes its input: plan's output holds the list at echo.queries,
    # and each element's output its element and index.
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "map200",
            [
                workload.Task("plan", input={"queries": queries}),
                workload.Task(
                    "search", ("plan",), {"sleep_ms": ELEMENT_MS}, map=("plan", "echo.queries")
                ),
                workload.Task("collect", ("search",)),
            ],
        ),
    )
    # Half-way, with the victim holding leases of elements it has not reported.
    await wait_succeeded(cluster, run_id, "a quarter of the elements", tasks=1 + ELEMENTS // 4)
    held, killed_at = await kill_holding(cluster, victim, ELEMENT_MS / 1000)
    await wait_run(cluster, run_id, within=90)

    rows = await cluster.fetch(
        """
        SELECT t.id, t.map_index, t.output,
               count(a.id) FILTER (WHERE a.state = 'succeeded') AS accepted,
               count(a.id) AS executions,
               min(a.started_at) FILTER (WHERE a.attempt > 1) AS rerun_at
          FROM tasks t JOIN tasks p ON p.id = t.parent_id AND p.key = 'search'
          JOIN attempts a ON a.task_id = t.id
         WHERE t.run_id = $1
         GROUP BY t.id ORDER BY t.map_index
        """,
        run_id,
    )
    assert [row["map_index"] for row in rows] == list(range(ELEMENTS))
    assert all(row["accepted"] == 1 for row in rows), "each element accepted exactly once"
    rerun = [row for row in rows if row["executions"] > 1]
    assert rerun, "the victim held elements when it was killed"
    assert {row["task_id"] for row in held} <= {row["id"] for row in rerun}

    # The map task's output, which its downstream received: the outputs in list order.
    search = await cluster.fetchval(
        "SELECT output FROM tasks WHERE run_id = $1 AND key = 'search'", run_id
    )
    outputs = json.loads(search)["outputs"]
    assert [o["echo"]["item"] for o in outputs] == queries
    assert [o["echo"]["index"] for o in outputs] == list(range(ELEMENTS))
    assert outputs == [json.loads(row["output"]) for row in rows]

    finished_at = await cluster.fetchval("SELECT finished_at FROM runs WHERE id = $1", run_id)
    last_rerun = max(row["rerun_at"] for row in rerun)
    report_figure(
        f"MAP200 worker kill -9: elements re-executed={len(rerun)}"
        f" (executions {sum(row['executions'] for row in rows)} for {ELEMENTS})"
        f" kill->all reruns started={seconds_between(killed_at, last_rerun):.2f}s"
        f" kill->run succeeded={seconds_between(killed_at, finished_at):.2f}s"
    )
    await cluster.check_invariants({run_id: Expect()})
