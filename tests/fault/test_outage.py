"""Fault scenario over real processes (DESIGN.md §7 "Offline", §10): PostgreSQL is down
for three offline thresholds while workers, connected to a live server, run work. No
live worker may be blamed for the platform's outage: every session stays active, no
worker process exits, every run succeeds. And the rule still finds a dead worker: one
killed with kill -9 afterwards is marked offline about one threshold after its last
heartbeat. Ends with the invariant check (kit.invariants).
"""

from __future__ import annotations

import asyncio
import time
from uuid import UUID

import pytest
import workload
from cluster import Cluster, wait_for
from figures import report_figure
from probes import seconds_between, wait_run, wait_succeeded

from kit.invariants import Expect

pytestmark = pytest.mark.fault


async def test_database_outage_of_three_thresholds_takes_no_live_worker_offline(
    pg_cluster: Cluster,
) -> None:
    cluster = pg_cluster
    postgres = cluster.postgres
    assert postgres is not None
    threshold = cluster.timings.offline_after_s
    await cluster.start_server()
    await cluster.start_coordinator()
    workers = [await cluster.start_worker(f"w{i}", concurrency=2) for i in (1, 2)]
    sessions = {handle.worker_id for handle in workers}
    run_id = await workload.start(
        cluster.control(),
        workload.definition("outage", workload.layers(6, 4, sleep_ms=400)),
    )
    await wait_succeeded(cluster, run_id, "the first results", attempts=2)

    down = time.monotonic()
    await asyncio.to_thread(postgres.stop, "immediate")
    # The fault itself, not a wait for a condition: the database stays away this long.
    await asyncio.sleep(3 * threshold)
    await asyncio.to_thread(postgres.start)
    outage = time.monotonic() - down
    up_at = await wait_for(cluster.db_now, "PostgreSQL to answer again")

    async def all_heartbeating() -> bool:
        found: bool = await cluster.fetchval(
            "SELECT bool_and(last_heartbeat_at > $1) FROM workers", up_at
        )
        return found

    await wait_for(all_heartbeating, "every session to heartbeat again", within=threshold * 2)
    back_at = await cluster.db_now()
    await wait_run(cluster, run_id, within=60)

    # The same sessions carried on: none offline, no new registration, no exit.
    rows = await cluster.fetch("SELECT id::text AS id, state FROM workers")
    assert {row["id"]: row["state"] for row in rows} == dict.fromkeys(sessions, "active")
    assert all(handle.process.alive for handle in workers)
    assert all(handle.process.count_logged("registered as") == 1 for handle in workers)
    report_figure(
        f"OUTAGE database down {outage:.1f}s (offline threshold {threshold:.1f}s):"
        f" sessions offline=0 of {len(sessions)}, worker exits=0,"
        f" up->every session heartbeating={seconds_between(up_at, back_at):.2f}s"
    )

    # A truly dead worker is still found in about one threshold of silence.
    victim = await cluster.start_worker("victim", concurrency=1)
    victim_id = UUID(victim.worker_id)
    victim.process.kill()
    killed_at = await cluster.db_now()

    async def offline_at() -> object:
        return await cluster.fetchval(
            "SELECT stopped_at FROM workers WHERE id = $1 AND state = 'offline'", victim_id
        )

    stopped_at = await wait_for(offline_at, "the killed worker to go offline", within=threshold * 4)
    last_heartbeat = await cluster.fetchval(
        "SELECT last_heartbeat_at FROM workers WHERE id = $1", victim_id
    )
    silence = seconds_between(last_heartbeat, stopped_at)
    report_figure(
        f"OUTAGE then kill -9 worker: offline {seconds_between(killed_at, stopped_at):.2f}s"
        f" after the kill, {silence:.2f}s of silence (threshold {threshold:.1f}s)"
    )
    assert threshold <= silence <= threshold + 2.0
    assert all(handle.process.alive for handle in workers)
    await cluster.check_invariants({run_id: Expect()})
