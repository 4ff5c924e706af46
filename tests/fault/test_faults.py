"""Fault scenarios over real processes (DESIGN.md §10). Each ends with the invariant check.

 1 fan-out/fan-in on two workers          7 SIGTERM drains a busy worker (+ hand-back)
 2 kill -9 a lease holder: attempt 2      8 no worker yet: tasks wait, a late one finishes
 3 a dead worker's replayed lease fenced   9 kill -9 the leading coordinator: standby leads
 4 awp-server SIGTERM / SIGKILL + restart 10 TCP proxy drops a worker's connections
 5 PostgreSQL down mid-task, then back    11 chaos: random kill -9 under a 300-task DAG
 6 cancel a running run                   12 a frozen (SIGSTOP) worker resumes too late

Run with `pytest -m fault` (add -s to see figures as they are measured; they are also
repeated under "awp fault figures" at the end). Waits poll database state with
deadlines; the only timed windows are fault cadence (chaos) and "nothing happens" proofs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from functools import partial
from uuid import UUID

import grpc
import pytest
import workload
from cluster import ADMIN_AUTH, WORKER_TOKEN, Cluster, WorkerProcess, wait_for
from figures import report_figure
from probes import revision, seconds_between, wait_attempt, wait_run
from proxy import TcpProxy

from awp.v1 import control_pb2, worker_pb2
from kit import rich_error, stays
from kit.invariants import Expect
from kit.rawworker import RawWorker

pytestmark = pytest.mark.fault


async def test_fan_out_fan_in_on_two_workers(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    await cluster.start_worker("w1", concurrency=4)
    await cluster.start_worker("w2", concurrency=4)
    # Eight branches for eight slots, each long enough that no worker frees a slot before
    # the other has claimed: the server caps each worker at 4 leases, so both must work.
    # (Short branches would let one worker do everything whenever the other is slow.)
    tasks = workload.fan_out_in(8, sleep_ms=1500)
    tasks[0] = workload.Task("start")
    tasks[-1] = workload.Task("join", tasks[-1].depends_on)
    run_id = await workload.start(cluster.control(), workload.definition("fan", tasks))
    await wait_run(cluster, run_id)
    await cluster.check_invariants({run_id: Expect()})
    by_worker = await cluster.fetch(
        """
        SELECT a.worker_id::text AS w, count(*) AS n
          FROM attempts a JOIN tasks t ON t.id = a.task_id
         WHERE a.run_id = $1 AND t.key LIKE 'branch%'
         GROUP BY 1
        """,
        run_id,
    )
    branches = {cluster.worker_of(row["w"]).process.name: row["n"] for row in by_worker}
    print(f"FANOUT branches per worker: {branches}")
    assert set(branches) == {"w1", "w2"}, branches


async def one_task_running_on_one_of_two(
    cluster: Cluster, workflow: str, key: str, sleep_ms: int
) -> tuple[UUID, WorkerProcess, WorkerProcess]:
    """Server, coordinator, two one-slot workers and a run of one task that sleeps
    sleep_ms: returns once the task runs, with the worker running it and the other."""
    await cluster.start_server()
    await cluster.start_coordinator()
    w1 = await cluster.start_worker("w1", concurrency=1)
    w2 = await cluster.start_worker("w2", concurrency=1)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(workflow, [workload.Task(key, input={"sleep_ms": sleep_ms})]),
    )
    first = await wait_attempt(cluster, run_id, key, 1, "running")
    holder = cluster.worker_of(first["worker_id"])
    return run_id, holder, w2 if holder is w1 else w1


# --- 2. kill -9 a worker holding a lease ----------------------------------------------


async def test_killed_workers_task_runs_again_on_the_other(cluster: Cluster) -> None:
    run_id, victim, survivor = await one_task_running_on_one_of_two(cluster, "kill9", "slow", 1500)

    killed_at = await cluster.db_now()
    victim.process.kill()
    second = await wait_attempt(cluster, run_id, "slow", 2)
    await wait_run(cluster, run_id)
    finished_at = await cluster.fetchval("SELECT finished_at FROM runs WHERE id = $1", run_id)
    to_attempt2 = seconds_between(killed_at, second["started_at"])
    report_figure(
        f"RECOVERY worker kill -9: kill->attempt2={to_attempt2:.2f}s"
        f" kill->success={seconds_between(killed_at, finished_at):.2f}s"
    )

    assert second["worker_id"] == survivor.worker_id
    first = await wait_attempt(cluster, run_id, "slow", 1)
    assert first["state"] == "interrupted"
    await cluster.check_invariants({run_id: Expect()})


# --- 3. a dead worker's lease, replayed, is fenced --------------------------------------


async def test_replayed_lease_of_a_dead_worker_is_fenced(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    run_id = await workload.start(
        cluster.control(),
        workload.definition("fence", [workload.Task("only", input={"sleep_ms": 1500})]),
    )
    holder, lease = await cluster.start_holder("holder")
    holder.kill()
    await cluster.start_worker("w1", concurrency=1)
    await wait_attempt(cluster, run_id, "only", 2, "running")

    # The dead holder's session and lease, replayed by another process.
    stolen = worker_pb2.Session(worker_id=lease.worker_id, session_token=lease.session_token)
    replayer = RawWorker(cluster.worker_stub(), WORKER_TOKEN, "replayer", stolen)
    held = worker_pb2.Lease(dispatch_id=lease.dispatch_id, lease_token=lease.lease_token)

    async def replay_complete() -> str:
        try:
            outcome = await replayer.complete(held, {"forged": True})
        except grpc.aio.AioRpcError as error:
            return rich_error(error).reason
        return str(worker_pb2.CompleteOutcome.Name(outcome))

    # While the dead session is still live (not yet offline) the lease itself fences...
    before = await revision(cluster, run_id)
    first = await replay_complete()
    assert first in ("COMPLETE_OUTCOME_LEASE_LOST", "SESSION_INVALID"), first
    assert await revision(cluster, run_id) == before
    # ...and once the coordinator has marked it offline, the session does.
    await wait_for(
        lambda: cluster.fetchval(
            "SELECT state = 'offline' FROM workers WHERE id = $1", UUID(lease.worker_id)
        ),
        "the dead holder's session to go offline",
    )
    before = await revision(cluster, run_id)
    assert await replay_complete() == "SESSION_INVALID"
    assert await revision(cluster, run_id) == before
    print(f"FENCE replay while live: {first}; after offline: SESSION_INVALID")

    await wait_run(cluster, run_id)
    output = await cluster.fetchval(
        "SELECT output FROM tasks WHERE run_id = $1 AND key = 'only'", run_id
    )
    assert "forged" not in json.loads(output)
    await cluster.check_invariants({run_id: Expect()})


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
    await wait_for(
        lambda: cluster.fetchval(
            "SELECT count(*) >= 2 FROM attempts WHERE run_id = $1 AND state = 'succeeded'", run_id
        ),
        "the first results",
    )
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
    await wait_for(
        lambda: worker.process.logged("safety deadline passed"),
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
        "SELECT output IS NULL FROM attempts WHERE dispatch_id = $1", first["dispatch_id"]
    )
    assert worker.process.alive
    await cluster.check_invariants({run_id: Expect()})


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
            control_pb2.CancelRunRequest(run_id=str(run_id), reason="fault test"),
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
        assert outcome == worker_pb2.COMPLETE_OUTCOME_LEASE_LOST
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


async def test_sigterm_past_the_shutdown_timeout_hands_the_lease_back(cluster: Cluster) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    # The task outlasts the worker's shutdown timeout: it must be handed back in the last
    # Drain and re-dispatched at once, not left "running" until its lease expires.
    w1 = await cluster.start_worker("w1", concurrency=1, shutdown_timeout=0.5)
    run_id = await workload.start(
        cluster.control(),
        workload.definition("handback", [workload.Task("long", input={"sleep_ms": 4000})]),
    )
    await wait_attempt(cluster, run_id, "long", 1, "running")
    w2 = await cluster.start_worker("w2", concurrency=1)
    signalled_at = await cluster.db_now()
    w1.process.terminate()
    assert await w1.process.wait_exit(20) == 0
    second = await wait_attempt(cluster, run_id, "long", 2)
    report_figure(
        "HANDBACK SIGTERM (shutdown timeout 0.5s)->attempt2="
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


# --- 9. the active coordinator dies, the standby takes over -----------------------------


async def test_standby_coordinator_takes_over(cluster: Cluster) -> None:
    await cluster.start_server()
    active = await cluster.start_coordinator("coordinator-a")
    standby = await cluster.start_coordinator("coordinator-b", expect_leader=False)
    await cluster.start_worker("w1", concurrency=2)
    await cluster.start_worker("w2", concurrency=2)
    run_id = await workload.start(
        cluster.control(),
        workload.definition("failover", workload.layers(4, 4, sleep_ms=250)),
    )
    await wait_for(
        lambda: cluster.fetchval(
            "SELECT count(*) >= 4 FROM tasks WHERE run_id = $1 AND state = 'succeeded'", run_id
        ),
        "the first layer to succeed",
    )
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
            await wait_for(
                partial(
                    cluster.fetchval,
                    "SELECT count(*) >= $2 FROM tasks WHERE run_id = $1 AND state = 'succeeded'",
                    run_id,
                    wave,
                ),
                f"{wave} results",
            )
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


# --- 12. (beyond) a frozen worker wakes up after its task was given to another --------


async def test_frozen_worker_resuming_late_is_fenced(cluster: Cluster) -> None:
    """SIGSTOP is a GC pause or a stalled VM: the connection stays up, nothing is sent.
    The lease runs out, the task runs again elsewhere; on SIGCONT the zombie's result
    (ready at once: its sleep ended while frozen) must be refused, and it must not
    take the task back."""
    run_id, zombie, other = await one_task_running_on_one_of_two(cluster, "zombie", "nap", 1000)
    zombie.process.signal(signal.SIGSTOP)
    try:
        second = await wait_attempt(cluster, run_id, "nap", 2, within=20)
    finally:
        zombie.process.signal(signal.SIGCONT)
    assert second["worker_id"] == other.worker_id
    await wait_run(cluster, run_id)

    # The zombie either noticed its safety deadline had passed or tried and was fenced.
    async def zombie_stood_down() -> bool:
        return await zombie.process.logged("safety deadline passed") or await zombie.process.logged(
            "lease lost before the result arrived"
        )

    await wait_for(zombie_stood_down, "the resumed worker to give up its stale lease")
    first = await wait_attempt(cluster, run_id, "nap", 1)
    assert first["state"] == "interrupted"
    await cluster.check_invariants({run_id: Expect()})


# --- 11. chaos: workers killed at random under a 300-task DAG ----------------------------

CHAOS_SEED = 20261202
CHAOS_MAX_KILLS = 10
CHAOS_DEADLINE_S = 120.0


async def test_chaos_random_worker_kills(cluster: Cluster) -> None:
    rng = random.Random(CHAOS_SEED)
    await cluster.start_server()
    await cluster.start_coordinator()
    live = [await cluster.start_worker(f"chaos-{i:02d}", concurrency=6) for i in range(3)]
    # 10 layers of 30, each task waiting on two of the layer above: ~20 s of work for
    # 18 slots. Attempts are generous: a task may be caught by several kills in a row,
    # and this test is about the platform's guarantees, not about exhausting retries.
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "chaos", workload.layers(10, 30, sleep_ms=600), max_attempts=20, timeout_ms=30_000
        ),
    )
    started = time.monotonic()

    async def run_over() -> bool:
        state = await cluster.fetchval("SELECT state FROM runs WHERE id = $1", run_id)
        return bool(state != "running")

    kills = 0
    names = len(live)
    while kills < CHAOS_MAX_KILLS and time.monotonic() - started < CHAOS_DEADLINE_S:
        # Inject the next fault ~2 s from now, unless the run ends first.
        with contextlib.suppress(AssertionError):
            await wait_for(run_over, "the run to end", within=rng.uniform(1.5, 2.5))
        if await run_over():
            break
        victim = live.pop(rng.randrange(len(live)))
        victim.process.kill()
        kills += 1
        live.append(await cluster.start_worker(f"chaos-{names:02d}", concurrency=6))
        names += 1

    remaining = CHAOS_DEADLINE_S - (time.monotonic() - started)
    await wait_run(cluster, run_id, within=max(remaining, 1.0))
    elapsed = time.monotonic() - started
    costs = await cluster.check_invariants({run_id: Expect()})
    cost = costs[run_id]
    report_figure(
        f"CHAOS {kills} kill -9 of {names} workers: 300 tasks succeeded in {elapsed:.1f}s,"
        f" executions={cost.executions} extra={cost.extra_executions}"
        f" interrupted={cost.attempts_by_state['interrupted']}"
    )
    assert kills >= 3, "the run ended before the chaos did anything: make it longer"
