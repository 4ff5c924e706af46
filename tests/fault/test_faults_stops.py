"""Fault scenarios over real processes (DESIGN.md §10): work stopped on purpose, and work
with nobody to run it yet. Each ends with the invariant check (kit.invariants).

 6 cancel a running run
 7 SIGTERM drains a busy worker (+ hand-back past the shutdown grace)
 8 no worker yet: tasks wait, a late one finishes
How they run and wait: see test_faults.py.
"""

from __future__ import annotations

import time

import pytest
import workload
from cluster import ADMIN_AUTH, WORKER_TOKEN, Cluster, wait_for
from figures import report_figure
from probes import revision, seconds_between, wait_attempt, wait_run

from awp.v1 import runs_pb2, session_pb2, worker_pb2
from kit import stays
from kit.invariants import Expect
from kit.rawworker import RawWorker

pytestmark = pytest.mark.fault


# --- 6. cancel a running run -----------------------------------------------------------


async def test_cancel_revokes_leases_and_fences_late_results(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    run_id = await workload.start(
        cluster.control(),
        workload.definition("cancel", workload.independent(6, sleep_ms=30_000)),
    )
    # A raw session takes one lease first (it can send a late result later), then
    # awp-worker takes four; one task is left waiting.
    raw = RawWorker(cluster.worker_stub(), WORKER_TOKEN, "raw")
    await raw.register(concurrency=1)
    raw.start_heartbeat()
    try:
        (late,) = await wait_for(lambda: raw.claim(1, 5.0), "the raw session to claim a lease")
        worker = await cluster.start_worker("w1", concurrency=4)
        await wait_for(
            lambda: cluster.fetchval(
                "SELECT count(*) = 5 FROM attempts WHERE run_id = $1 AND state = 'running'", run_id
            ),
            "five running attempts",
        )
        await cluster.control().CancelRun(
            runs_pb2.CancelRunRequest(run_id=str(run_id), reason="fault test"),
            metadata=ADMIN_AUTH,
            timeout=10,
        )
        await wait_run(cluster, run_id, "canceled")

        # Leases revoked: the heartbeat says so, and a late result is fenced.
        async def revoked() -> bool:
            return worker_pb2.LEASE_STATUS_REVOKED in raw.answers.get(late.dispatch_id, [])

        await wait_for(revoked, "the raw session's heartbeat to answer REVOKED")
        before = await revision(cluster, run_id)
        outcome = await raw.complete(late, {"late": True})
        assert outcome == session_pb2.COMPLETE_OUTCOME_LEASE_LOST
        assert await revision(cluster, run_id) == before
    finally:
        await raw.stop_heartbeat()

    # awp-worker stopped its four executors on REVOKED instead of running them out.
    async def stopped_four() -> bool:
        return worker.process.count_logged("lease revoked") == 4

    await wait_for(stopped_four, "awp-worker to stop its four leases")
    assert (
        await cluster.fetchval(
            "SELECT count(*) FROM dispatches WHERE run_id = $1 AND state IN ('pending', 'leased')",
            run_id,
        )
        == 0
    )
    states = await cluster.fetch(
        "SELECT state, count(*) AS n FROM attempts WHERE run_id = $1 GROUP BY state", run_id
    )
    assert {row["state"]: row["n"] for row in states} == {"canceled": 5}
    await cluster.check_invariants({run_id: Expect("canceled", "canceled")})


# --- 7. SIGTERM a busy worker -----------------------------------------------------------


async def test_sigterm_drains_a_busy_worker(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    w1 = await cluster.start_worker("w1", concurrency=2)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "drain",
            [
                workload.Task("busy", input={"sleep_ms": 1500}),
                workload.Task("after", ("busy",)),
            ],
        ),
    )
    await wait_attempt(cluster, run_id, "busy", 1, "running")
    signalled = time.monotonic()
    w1.process.terminate()
    assert await w1.process.wait_exit(20) == 0
    report_figure(f"DRAIN worker SIGTERM->exit 0={time.monotonic() - signalled:.2f}s (task 1.5s)")

    busy = await wait_attempt(cluster, run_id, "busy", 1)
    assert (busy["state"], busy["worker_id"]) == ("succeeded", w1.worker_id)
    session = await cluster.fetchrow(
        "SELECT state, stopped_at FROM workers WHERE id = $1::uuid", w1.worker_id
    )
    assert session is not None
    assert session["state"] == "stopped" and session["stopped_at"] is not None
    # Draining, it took nothing new: the dependent waits for another worker.
    assert await cluster.fetchval(
        "SELECT state FROM tasks WHERE run_id = $1 AND key = 'after'", run_id
    ) in ("ready", "queued")
    w2 = await cluster.start_worker("w2", concurrency=2)
    await wait_run(cluster, run_id)
    after = await wait_attempt(cluster, run_id, "after", 1)
    assert after["worker_id"] == w2.worker_id
    await cluster.check_invariants({run_id: Expect()})


async def test_sigterm_past_the_shutdown_grace_hands_the_lease_back(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    # The task outlasts the worker's shutdown grace: it must be handed back in the last
    # Drain and re-dispatched at once, not left "running" until its lease expires. With
    # one attempt and a long backoff, only a free hand-back lets it succeed. Both workers
    # are up before the run starts, so that nothing slow (a process start) lies between
    # the attempt starting and the SIGTERM: the 4 s task is still running at the timeout.
    workers = {
        worker.worker_id: worker
        for worker in [
            await cluster.start_worker(name, concurrency=1, shutdown_grace=0.5)
            for name in ("w1", "w2")
        ]
    }
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "handback",
            [workload.Task("long", input={"sleep_ms": 4000})],
            max_attempts=1,
            backoff_ms=60_000,
        ),
    )
    first = await wait_attempt(cluster, run_id, "long", 1, "running")
    holder = workers.pop(first["worker_id"])
    (w2,) = workers.values()
    signalled_at = await cluster.db_now()
    holder.process.terminate()
    assert await holder.process.wait_exit(20) == 0
    second = await wait_attempt(cluster, run_id, "long", 2)
    report_figure(
        "HANDBACK SIGTERM (shutdown grace 0.5s)->attempt2="
        f"{seconds_between(signalled_at, second['started_at']):.2f}s"
    )
    first = await wait_attempt(cluster, run_id, "long", 1)
    assert first["state"] == "interrupted"
    assert second["worker_id"] == w2.worker_id
    error = await cluster.fetchval(
        "SELECT error->>'message' FROM attempts WHERE dispatch_id = $1", first["dispatch_id"]
    )
    assert "handed back" in error, error
    await wait_run(cluster, run_id)
    await cluster.check_invariants({run_id: Expect()})


# --- 8. no worker yet -------------------------------------------------------------------


async def test_tasks_wait_for_a_worker_that_registers_later(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    run_id = await workload.start(
        cluster.control(), workload.definition("later", workload.fan_out_in(3))
    )
    # Nothing can take the root task: it must stay ready, undispatched, for a while
    # (an observation window of many coordinator passes, not a wait for an event).
    await stays(
        lambda: cluster.fetchval(
            """
            SELECT bool_and(state = CASE WHEN key = 'start' THEN 'ready' ELSE 'pending' END)
                   AND NOT EXISTS (SELECT 1 FROM dispatches WHERE run_id = $1)
              FROM tasks WHERE run_id = $1
            """,
            run_id,
        ),
        "the run to wait, untouched, for a worker",
        observe_for=8 * cluster.timings.scan_s,
    )
    started = time.monotonic()
    await cluster.start_worker("late", concurrency=2)
    await wait_run(cluster, run_id)
    report_figure(f"LATE worker process start->run succeeded={time.monotonic() - started:.2f}s")
    await cluster.check_invariants({run_id: Expect()})
