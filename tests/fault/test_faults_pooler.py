"""The whole cluster behind a real pgbouncer (Debian's 1.18) in transaction mode, as
docs/postgres.md sets it up: --database-url on the transaction pool, LISTEN over
--session-database-url (a session pool of the same pgbouncer), the limits on the role.
Ends with the invariant check (kit.invariants).

14 a workflow runs to success through the pooler; the leading coordinator is killed
   (kill -9) and the standby leads within the lease's bound; wake-ups still arrive over
   the session URL; no process logs a prepared-statement error (issue 16)

The coordinators scan only every 30 s, while their lease keeps its production length
(--leader-ttl 1.5 s): a run dispatched at once after StartRun can only have been woken by
a notification (StartRun's NOTIFY, heard over the session URL), never by the scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from uuid import UUID

import pytest
import workload
from cluster import Cluster, wait_for
from figures import report_figure
from probes import seconds_between, wait_run

from awp_db import leadership
from awp_db.connect import SessionLimits
from kit.invariants import Expect
from kit.pgbouncer import PgBouncer

pytestmark = pytest.mark.fault

SCAN_S = 30.0
LEADER_TTL_S = 1.5
# A standby tries again at the lease's expiry it saw: it leads at most one lease after the
# dead leader's last renewal, plus its own wake-up (docs/leadership.md).
TAKEOVER_BOUND_S = 2.0
# Only in the session URL, passed in the environment: it must never reach a log.
PASSWORD = "pooler-secret-7f3a"


@pytest.fixture
async def bouncer(cluster: Cluster) -> AsyncIterator[PgBouncer]:
    bouncer = PgBouncer(cluster.dsn).start()
    try:
        await bouncer.wait_ready()
        yield bouncer
    finally:
        bouncer.stop()


async def _limits_on_the_role(cluster: Cluster) -> None:
    """What docs/postgres.md asks of an operator: the servers' limits (the strictest of
    the processes') set on the role the pooler logs in as, in this database."""
    limits = SessionLimits.for_lease_ttl(cluster.timings.lease_ttl_s)
    major = int(await cluster.fetchval("SHOW server_version_num")) // 10000
    database = await cluster.fetchval("SELECT current_database()")
    for name, ms in limits.waits(major).items():
        await cluster.fetchval(f"ALTER ROLE postgres IN DATABASE {database} SET {name} = {ms}")


async def _dispatch_latency(cluster: Cluster, run_id: UUID) -> tuple[float, float]:
    """Seconds from StartRun to the run's first dispatch (the coordinator's wake-up), and
    from that dispatch to its claim (the parked Claim's wake-up), on the database clock."""
    row = await cluster.fetchrow(
        """SELECT r.created_at AS started, d.created_at AS dispatched, a.started_at AS claimed
             FROM runs r
             JOIN dispatches d ON d.run_id = r.id
             JOIN attempts a ON a.dispatch_id = d.id
            WHERE r.id = $1
            ORDER BY d.created_at LIMIT 1""",
        run_id,
    )
    assert row is not None
    return (
        seconds_between(row["started"], row["dispatched"]),
        seconds_between(row["dispatched"], row["claimed"]),
    )


async def test_a_cluster_behind_a_transaction_pooler(cluster: Cluster, bouncer: PgBouncer) -> None:
    await _limits_on_the_role(cluster)
    cluster.timings = dataclasses.replace(cluster.timings, scan_s=SCAN_S, claim_wait_s=10.0)
    cluster.env["AWP_DATABASE_POOL_MODE"] = "transaction"
    cluster.env["AWP_SESSION_DATABASE_URL"] = bouncer.session_dsn.replace(
        "awp@", f"awp:{PASSWORD}@"
    )
    cluster.env["AWP_LEADER_TTL"] = str(LEADER_TTL_S)
    pooled = bouncer.pooled_dsn
    await cluster.start_server(database_url=pooled)
    first = await cluster.start_coordinator("coordinator-a", database_url=pooled)
    await cluster.start_worker("w1", concurrency=4)

    run_id = await workload.start(
        cluster.control(), workload.definition("pooled", workload.layers(3, 4, sleep_ms=20))
    )
    await wait_run(cluster, run_id)
    woke, claimed = await _dispatch_latency(cluster, run_id)
    report_figure(
        f"POOLER wake-ups (pgbouncer transaction mode, LISTEN over the session URL): "
        f"StartRun->dispatch={woke * 1000:.0f}ms (scan every {SCAN_S:g}s), "
        f"dispatch->claim={claimed * 1000:.0f}ms (parked Claim)"
    )
    assert woke < SCAN_S / 2, "the dispatch waited for the periodic scan: no wake-up"

    second = await cluster.start_coordinator(
        "coordinator-b", expect_leader=False, database_url=pooled
    )
    before = await leadership.current(await cluster.pool())
    assert before is not None and before.holder == first.name
    killed_at = await cluster.db_now()
    first.kill()

    async def second_leads() -> leadership.Lease | None:
        lease = await leadership.current(await cluster.pool())
        return lease if lease is not None and lease.holder == second.name else None

    lease = await wait_for(second_leads, "the standby to take the leader lease", within=30)
    took = seconds_between(killed_at, lease.acquired_at)
    report_figure(
        f"TAKEOVER behind pgbouncer (transaction mode), coordinator kill -9: "
        f"kill->standby leads={took:.2f}s (lease {LEADER_TTL_S:g}s, bound {TAKEOVER_BOUND_S:g}s)"
    )
    assert took <= TAKEOVER_BOUND_S, f"takeover took {took:.2f} s"
    assert lease.epoch == before.epoch + 1

    # The new leader hears StartRun over its own session URL, as the first did.
    run_after = await workload.start(
        cluster.control(), workload.definition("pooled-after", workload.fan_out_in(4))
    )
    await wait_run(cluster, run_after)
    woke_after, claimed_after = await _dispatch_latency(cluster, run_after)
    report_figure(
        f"POOLER wake-ups under the new leader: StartRun->dispatch={woke_after * 1000:.0f}ms, "
        f"dispatch->claim={claimed_after * 1000:.0f}ms"
    )
    assert woke_after < SCAN_S / 2, "the new leader waited for its periodic scan"

    for name, process in cluster.processes.items():
        text = process.output(current_only=False)
        assert "prepared statement" not in text, f"{name} met a prepared statement error"
        assert "session limits not in force" not in text, f"{name}: limits not on the role"
        assert PASSWORD not in text, f"{name} logged the database password"
    await cluster.check_invariants({run_id: Expect(), run_after: Expect()})
