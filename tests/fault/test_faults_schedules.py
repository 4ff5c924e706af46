"""Fault scenarios of schedules over real processes (docs/schedules.md): a 1-second
schedule keeps firing every tick exactly once while its leader is cut off from
PostgreSQL (the TCP proxy goes dark), stopped past its lease (SIGSTOP) and killed
(kill -9); and catches up after the whole stack was down for more than 5 ticks. Each
checks, from the runs' schedule and tick, that every tick of the window fired exactly
once, and that no tick was created under a stale epoch (kit.invariants.schedules).
"""

from __future__ import annotations

import dataclasses
import signal
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import pytest
import workload
from cluster import ADMIN_AUTH, Cluster, wait_for
from figures import report_figure
from google.protobuf import duration_pb2
from proxy import TcpProxy

from awp.v1 import schedule_pb2
from awp_db import leadership
from awp_kernel.schedules import Cadence
from kit.invariants.schedules import check_fired_exactly_once, check_schedule_ticks

pytestmark = pytest.mark.fault

SECOND = Cadence(None, 1000, "UTC")


async def _every_second(cluster: Cluster) -> UUID:
    control = cluster.control()
    await workload.start(control, workload.definition("tick", workload.layers(1, 1)))
    created = await control.CreateSchedule(
        schedule_pb2.CreateScheduleRequest(
            schedule=schedule_pb2.ScheduleSpec(
                name="every-second",
                workflow_name="tick",
                interval=duration_pb2.Duration(seconds=1),
                overlap=schedule_pb2.OVERLAP_POLICY_ALLOW_ALL,
                catchup=schedule_pb2.CATCHUP_POLICY_ALL,
                catchup_window=duration_pb2.Duration(seconds=60),
            )
        ),
        metadata=ADMIN_AUTH,
        timeout=10,
    )
    return UUID(created.schedule.id)


async def _first_tick(cluster: Cluster, schedule_id: UUID) -> datetime:
    async def first() -> datetime | None:
        found: datetime | None = await cluster.fetchval(
            "SELECT min(schedule_tick) FROM runs WHERE schedule_id = $1", schedule_id
        )
        return found

    return await wait_for(first, "the first tick", within=30)


async def _fired_through(cluster: Cluster, schedule_id: UUID, end: datetime) -> None:
    async def through() -> bool:
        newest = await cluster.fetchval(
            "SELECT max(schedule_tick) FROM runs WHERE schedule_id = $1", schedule_id
        )
        return newest is not None and newest >= end

    await wait_for(through, f"ticks through {end}", within=60)


async def _leader_after(cluster: Cluster, epoch: int) -> leadership.Lease:
    async def newer() -> leadership.Lease | None:
        lease = await leadership.current(await cluster.pool())
        return lease if lease is not None and lease.epoch > epoch else None

    return await wait_for(newer, f"a leader after epoch {epoch}", within=30)


async def _lease(cluster: Cluster) -> leadership.Lease:
    lease = await leadership.current(await cluster.pool())
    assert lease is not None
    return lease


async def _ticks_under(cluster: Cluster, schedule_id: UUID, epoch: int) -> int:
    count: int = await cluster.fetchval(
        "SELECT count(*) FROM schedule_ticks WHERE schedule_id = $1 AND leader_epoch = $2",
        schedule_id,
        epoch,
    )
    return count


async def _fired_under(cluster: Cluster, schedule_id: UUID, epoch: int) -> bool:
    """A few ticks fired under this epoch: the window spans each leader's term."""
    return await _ticks_under(cluster, schedule_id, epoch) >= 3


async def _lateness(cluster: Cluster, schedule_id: UUID) -> str:
    row = await cluster.fetchrow(
        """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l) AS p50,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY l) AS p99
             FROM (SELECT extract(epoch FROM created_at - schedule_tick) * 1000 AS l
                     FROM runs WHERE schedule_id = $1) x""",
        schedule_id,
    )
    assert row is not None
    return f"p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms"


async def test_every_tick_fires_once_across_partition_stop_and_kill_of_the_leader(
    cluster: Cluster,
) -> None:
    # The production scan interval: a lease of 1.5 s, so every failover spans ticks.
    cluster.timings = dataclasses.replace(cluster.timings, scan_s=1.0)
    target = urlsplit(cluster.dsn)
    assert target.hostname is not None and target.port is not None, cluster.dsn
    proxy = await TcpProxy(target.hostname, target.port).start()
    try:
        proxied = urlunsplit(target._replace(netloc=f"{target.username}@{proxy.address}"))
        await cluster.start_server()
        a = await cluster.start_coordinator("coordinator-a", database_url=proxied)
        b = await cluster.start_coordinator("coordinator-b", expect_leader=False)
        schedule_id = await _every_second(cluster)
        start = await _first_tick(cluster, schedule_id)

        # 1. The leader is cut off from PostgreSQL: the standby takes over.
        first = await _lease(cluster)
        assert first.holder == "coordinator-a"
        proxy.partition()
        second = await _leader_after(cluster, first.epoch)
        assert second.holder == "coordinator-b"
        await wait_for(
            lambda: _fired_under(cluster, schedule_id, second.epoch), "ticks under b", within=30
        )
        proxy.heal()
        await wait_for(lambda: a.logged("standing by"), "a to stand by again", within=30)

        # 2. The leader is stopped past its lease: the other takes over; resumed, the
        # stopped one creates nothing under its old epoch.
        b.signal(signal.SIGSTOP)
        third = await _leader_after(cluster, second.epoch)
        assert third.holder == "coordinator-a"
        under_second = await _ticks_under(cluster, schedule_id, second.epoch)
        await wait_for(
            lambda: _fired_under(cluster, schedule_id, third.epoch), "ticks under a", within=30
        )
        b.signal(signal.SIGCONT)
        await wait_for(lambda: b.logged("leadership lost"), "b to step down", within=30)
        assert await _ticks_under(cluster, schedule_id, second.epoch) == under_second

        # 3. The leader is killed: the other takes over.
        a.kill()
        fourth = await _leader_after(cluster, third.epoch)
        assert fourth.holder == "coordinator-b"
        end = await cluster.db_now() + timedelta(seconds=2)
        await _fired_through(cluster, schedule_id, end)

        window = await check_fired_exactly_once(
            await cluster.pool(), schedule_id, SECOND, start, end
        )
        epochs = await cluster.fetchval(
            "SELECT count(DISTINCT leader_epoch) FROM schedule_ticks WHERE schedule_id = $1",
            schedule_id,
        )
        assert epochs == 4, f"the window's ticks were fired under {epochs} terms"
        await check_schedule_ticks(await cluster.pool())
        await cluster.check_invariants({})
        report_figure(
            f"SCHEDULE 1 s across partition, SIGSTOP, kill -9 of the leader: {window} ticks, "
            f"each fired once; lateness {await _lateness(cluster, schedule_id)}"
        )
    finally:
        await proxy.close()


async def test_a_stack_down_for_five_ticks_catches_up_every_tick(cluster: Cluster) -> None:
    server = await cluster.start_server()
    coordinator = await cluster.start_coordinator("coordinator-a")
    schedule_id = await _every_second(cluster)
    start = await _first_tick(cluster, schedule_id)
    await _fired_through(cluster, schedule_id, start + timedelta(seconds=2))
    coordinator.kill()
    server.kill()
    down_at = await cluster.db_now()

    async def six_ticks_passed() -> bool:
        return (await cluster.db_now()) - down_at >= timedelta(seconds=6)

    # Down on the database clock for more than five ticks.
    await wait_for(six_ticks_passed, "six ticks of downtime", within=30)
    await cluster.start_server()
    await cluster.start_coordinator("coordinator-b")
    end = await cluster.db_now()
    await _fired_through(cluster, schedule_id, end)
    window = await check_fired_exactly_once(await cluster.pool(), schedule_id, SECOND, start, end)
    assert window >= 8
    await check_schedule_ticks(await cluster.pool())
    await cluster.check_invariants({})
    report_figure(f"SCHEDULE 1 s, whole stack down 6 s: {window} ticks, each fired once")
