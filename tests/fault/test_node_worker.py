"""A worker in another language: examples/node-worker (grpc-js + the shared protos) runs a
workflow against the real awp-server and awp-coordinator, alone."""

from __future__ import annotations

import json
import shutil

import pytest
import workload
from cluster import WORKER_TOKEN, Cluster
from probes import wait_run
from process import REPO

from kit.invariants import Expect

NODE = shutil.which("node")
EXAMPLE = REPO / "examples" / "node-worker"

pytestmark = [
    pytest.mark.fault,
    pytest.mark.skipif(NODE is None, reason="`node` is not on PATH: the Node.js worker cannot run"),
]


async def test_node_worker_runs_a_workflow_alone(cluster: Cluster) -> None:
    assert NODE is not None
    if not (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail(
            f"{EXAMPLE / 'node_modules'} is missing: run "
            "`(cd examples/node-worker && npm ci --no-audit --no-fund)` (.ci/run does)"
        )
    await cluster.start_server()
    await cluster.start_coordinator()
    node = await cluster.start_foreign_worker(
        "node-1",
        [
            NODE,
            str(EXAMPLE / "worker.js"),
            "--server",
            cluster.server_address,
            "--worker-token",
            WORKER_TOKEN,
            "--name",
            "node-1",
            "--concurrency",
            "4",
            "--safety-margin",
            str(cluster.timings.safety_margin_s),
        ],
    )
    tasks = workload.fan_out_in(6, sleep_ms=100)
    # One retryable failure first: the Node worker reports FAILED, the retry succeeds.
    tasks.append(workload.Task("flaky", ("start",), {"fail_attempts": 1}))
    run_id = await workload.start(cluster.control(), workload.definition("node", tasks))
    await wait_run(cluster, run_id)

    workers = await cluster.fetch(
        "SELECT DISTINCT worker_id::text AS id FROM attempts WHERE run_id = $1", run_id
    )
    assert [row["id"] for row in workers] == [node.worker_id]
    outputs = await cluster.fetch("SELECT key, output FROM tasks WHERE run_id = $1", run_id)
    for row in outputs:
        output = json.loads(row["output"])
        assert output["worker"] == "node", (row["key"], output)
    flaky = await cluster.fetch(
        """
        SELECT a.attempt, a.state FROM attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1 AND t.key = 'flaky' ORDER BY a.attempt
        """,
        run_id,
    )
    assert [(r["attempt"], r["state"]) for r in flaky] == [(1, "failed"), (2, "succeeded")]
    await cluster.check_invariants({run_id: Expect()})

    # SIGTERM drains: the session ends stopped and the process exits 0.
    node.process.terminate()
    assert await node.process.wait_exit(15) == 0
    state = await cluster.fetchval("SELECT state FROM workers WHERE id = $1::uuid", node.worker_id)
    assert state == "stopped"
