"""A stalled awp-server never halts the cluster (DESIGN.md §6, docs/liveness.md): two
replicas serve one busy run; one is stopped while it holds a transaction the others
wait for. Each ends with the invariant check (kit.invariants).

13 SIGSTOP a replica inside a transaction (a GC pause, a frozen VM)
14 partition a replica from PostgreSQL inside a transaction (a TCP proxy goes dark)

The bound: results are accepted again within twice the stall bound S (what PostgreSQL
allows a session idle in a transaction; 1 s at these timings, a fifth of the lease TTL)
plus one second, however long the replica stays stopped -- the other replica must
accept ACCEPTED_DURING_STALL results before the stalled one is let go. Twice: the
stalled replica's other lane (Claim or Complete) may be queued for the same run lock;
it gets the lock when the first holder is dropped, and holds it, idle, for one more S.
Measured: mostly S, sometimes 1.7 S. Without the session limits nothing would be
accepted until the replica was let go.
"""

from __future__ import annotations

import pytest
import stalls
from cluster import Cluster

pytestmark = pytest.mark.fault


async def test_a_replica_stopped_inside_a_transaction_does_not_halt_the_cluster(
    cluster: Cluster,
) -> None:
    replicas = await stalls.start(cluster, "sigstop")
    stalled = cluster.process("server")
    try:
        try:
            since = await stalls.catch_in_transaction(replicas, stalled.freeze, stalled.thaw)
            resume_s, stalled_s = await stalls.measure_resume(replicas, since)
            assert stalled.alive  # still stopped: the others went on without it
        finally:
            stalled.thaw()
        await stalls.finish(replicas, "SIGSTOP in a transaction", resume_s, stalled_s)
    finally:
        await replicas.proxy.close()


async def test_a_replica_partitioned_from_postgres_does_not_halt_the_cluster(
    cluster: Cluster,
) -> None:
    replicas = await stalls.start(cluster, "partition")
    proxy = replicas.proxy
    try:
        try:

            async def partition() -> None:
                proxy.partition()

            since = await stalls.catch_in_transaction(replicas, partition, proxy.heal)
            resume_s, stalled_s = await stalls.measure_resume(replicas, since)
        finally:
            proxy.heal()
        await stalls.finish(replicas, "partitioned from PostgreSQL", resume_s, stalled_s)
    finally:
        await proxy.close()
