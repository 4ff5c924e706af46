"""Fault scenarios over real processes (DESIGN.md §10): the platform's own processes and
network fail under running work. Each ends with the invariant check (kit.invariants).

 4 awp-server SIGTERM / SIGKILL + restart   9 kill -9 the leading coordinator: standby leads
 5 PostgreSQL down mid-task, then back     10 TCP proxy drops a worker's connections
How they run and wait: see test_faults.py.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest
import workload
from cluster import Cluster, wait_for
from figures import report_figure
from probes import seconds_between, wait_attempt, wait_run, wait_succeeded
from proxy import TcpProxy

from awp_worker._lease import STOOD_DOWN, StandDown
from kit.invariants import Expect

pytestmark = pytest.mark.fault


# --- 4. awp-server stopped and restarted mid-run ----------------------------------------


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_server_restart_keeps_worker_sessions(cluster: Cluster, how: str) -> None:
    server = await cluster.start_server()
    await cluster.start_coordinator()
    w1 = await cluster.start_worker("w1", concurrency=2)
    w2 = await cluster.start_worker("w2", concurrency=2)
    run_id = await workload.start(
        cluster.control(),
        workload.definition("restart", workload.layers(3, 4, sleep_ms=400)),
    )
    # Mid-run: some results in, others running.
    await wait_succeeded(cluster, run_id, "the first results", attempts=2)
    stopping_at = await cluster.db_now()
    if how == "SIGTERM":
        server.terminate()
        assert await server.wait_exit(30) == 0
        stopped_at = await cluster.db_now()
        await cluster.start_server()
    else:
        await cluster.restart("server", graceful=False)
        stopped_at = stopping_at  # kill -9 is immediate
    serving_at = await cluster.db_now()
    await wait_run(cluster, run_id)
    report_figure(
        f"RESTART server {how}: stop->exit={seconds_between(stopping_at, stopped_at):.2f}s"
        f" exit->serving={seconds_between(stopped_at, serving_at):.2f}s"
    )

    # The same two sessions carried on: no new registration, both heartbeat the new
    # server, and results were accepted from them after it came up.
    sessions = await cluster.fetch(
        "SELECT id::text AS id, state, last_heartbeat_at FROM workers ORDER BY registered_at"
    )
    assert [row["id"] for row in sessions] == [w1.worker_id, w2.worker_id]
    await wait_for(
        lambda: cluster.fetchval(
            "SELECT bool_and(state = 'active' AND last_heartbeat_at > $1) FROM workers",
            serving_at,
        ),
        "both sessions to heartbeat the restarted server",
    )
    accepted_after = await cluster.fetchval(
        "SELECT count(*) FROM attempts WHERE run_id = $1 AND state = 'succeeded'"
        " AND finished_at > $2",
        run_id,
        serving_at,
    )
    assert accepted_after > 0
    assert w1.process.alive and w2.process.alive
    await cluster.check_invariants({run_id: Expect()})


# --- 5. PostgreSQL unavailable mid-task ------------------------------------------------


async def test_database_outage_cancels_by_safety_deadline_then_recovers(
    pg_cluster: Cluster,
) -> None:
    cluster = pg_cluster
    postgres = cluster.postgres
    assert postgres is not None
    await cluster.start_server()
    await cluster.start_coordinator()
    worker = await cluster.start_worker("w1", concurrency=1)
    run_id = await workload.start(
        cluster.control(),
        workload.definition("outage", [workload.Task("long", input={"sleep_ms": 3000})]),
    )
    await wait_attempt(cluster, run_id, "long", 1, "running")

    down = time.monotonic()
    await asyncio.to_thread(postgres.stop, "immediate")

    # No renewal can succeed now: the worker must stop on its own clock.
    async def cancelled_at_safety_deadline() -> bool:
        lines = worker.process.json_lines()
        return any(line.get(STOOD_DOWN) == StandDown.SAFETY_DEADLINE for line in lines)

    await wait_for(
        cancelled_at_safety_deadline,
        "the worker to cancel the executor at its safety deadline",
        within=10,
    )
    cancelled = time.monotonic()
    await asyncio.to_thread(postgres.start)
    up = time.monotonic()
    up_at = await wait_for(cluster.db_now, "PostgreSQL to answer again")
    second = await wait_attempt(cluster, run_id, "long", 2, within=30)
    await wait_run(cluster, run_id, within=30)
    report_figure(
        f"RECOVERY database outage: down->executor cancelled={cancelled - down:.2f}s"
        f" (outage {up - down:.2f}s) up->attempt2="
        f"{max(0.0, seconds_between(up_at, second['started_at'])):.2f}s"
    )

    first = await wait_attempt(cluster, run_id, "long", 1)
    assert first["state"] == "interrupted"
    # The first attempt never reported: its executor was stopped, not left running.
    assert await cluster.fetchval(
        "SELECT result_hash IS NULL FROM dispatches WHERE id = $1", first["dispatch_id"]
    )
    assert worker.process.alive
    await cluster.check_invariants({run_id: Expect()})


# --- 9. the active coordinator dies, the standby takes over -----------------------------


async def test_standby_coordinator_takes_over(cluster: Cluster) -> None:
    # Only the coordinators grant (no Claim grants what no offer covers): what is shown
    # is that the standby's passes do the work once the leader is gone.
    await cluster.start_server(extra=["--no-claim-grants"])
    active = await cluster.start_coordinator("coordinator-a")
    standby = await cluster.start_coordinator("coordinator-b", expect_leader=False)
    await cluster.start_worker("w1", concurrency=2)
    await cluster.start_worker("w2", concurrency=2)
    run_id = await workload.start(
        cluster.control(),
        workload.definition("failover", workload.layers(4, 4, sleep_ms=250)),
    )
    await wait_succeeded(cluster, run_id, "the first layer to succeed", tasks=4)
    killed = time.monotonic()
    active.kill()

    async def standby_leads() -> bool:
        return await cluster.leader_pid() == standby.pid

    await wait_for(standby_leads, "the standby to take the leader lock")
    took_over = time.monotonic()
    await wait_run(cluster, run_id)
    report_figure(
        f"FAILOVER coordinator kill -9: kill->standby leads={took_over - killed:.2f}s"
        f" kill->run succeeded={time.monotonic() - killed:.2f}s"
    )
    # The new leader did the work after the old one died: its passes dispatched.
    assert any(line.get("dispatched") for line in standby.json_lines())
    await cluster.check_invariants({run_id: Expect()})


# --- 10. the network between a worker and the server drops ---------------------------


async def test_worker_reconnects_after_connections_drop(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    proxy = await TcpProxy("127.0.0.1", cluster.server_port).start()
    try:
        worker = await cluster.start_worker("w1", concurrency=4, server=proxy.address)
        run_id = await workload.start(
            cluster.control(),
            workload.definition("netdrop", workload.independent(24, sleep_ms=300)),
        )
        done = 0
        for wave in (4, 12):  # two cuts: early, and mid-run with results in flight
            await wait_succeeded(cluster, run_id, f"{wave} results", tasks=wave)
            cut_at = await cluster.db_now()
            cut = proxy.drop_all()
            assert cut >= 1
            done = await cluster.fetchval(
                "SELECT count(*) FROM tasks WHERE run_id = $1 AND state = 'succeeded'", run_id
            )
            next_result = await wait_for(
                partial(
                    cluster.fetchval,
                    "SELECT min(finished_at) FROM attempts WHERE run_id = $1"
                    " AND state = 'succeeded' AND finished_at > $2",
                    run_id,
                    cut_at,
                ),
                "a result after the cut",
            )
            report_figure(
                f"NETDROP cut {cut} connection(s) after {done} results:"
                f" cut->next accepted result={seconds_between(cut_at, next_result):.2f}s"
            )
        await wait_run(cluster, run_id)
        # The worker kept its one session across the cuts, over new connections.
        assert proxy.accepted > 1
        sessions = await cluster.fetch("SELECT id::text AS id, state FROM workers")
        assert [(row["id"], row["state"]) for row in sessions] == [(worker.worker_id, "active")]
    finally:
        await proxy.close()
    await cluster.check_invariants({run_id: Expect()})
