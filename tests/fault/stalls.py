"""Two awp-server replicas, one made to stall inside a transaction that others wait for
(a SIGSTOP, or a partition from PostgreSQL), and how soon the rest of the cluster goes
on (DESIGN.md §6, docs/liveness.md). Used by test_stalls.py.

The stalled replica ("server") reaches PostgreSQL through a TcpProxy: a partition is
the proxy's, and the proxy's upstream ports name that replica's backends in
pg_stat_activity (client_port), which is how a test finds its open transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import workload
from asyncpg import Record
from cluster import Cluster, wait_for
from figures import report_figure
from probes import seconds_between, wait_run
from proxy import TcpProxy

from awp_common.processes import free_port
from awp_db.connect import SessionLimits
from kit.invariants import Expect

# A steady stream of short results, all of one run: every Claim and Complete takes that
# run's row lock, so one transaction holding it stops everyone who reports.
TASKS = 1200
TASK_MS = 20
# Attempts at SIGSTOP/partitioning the replica at the moment it holds a lock others want.
MAX_CATCHES = 400
# How long the replica, busy with the run, may go without being seen in a transaction.
TRANSACTION_SEEN_WITHIN_S = 10.0
# Results the other replica must accept while the stalled one is still stopped.
ACCEPTED_DURING_STALL = 40
# What the stall may cost beyond twice the stall bound (test_stalls.py says why twice):
# the waiting transactions' own work and this test's polling, on a busy two-core machine.
SLACK_S = 1.0


@dataclass
class Replicas:
    cluster: Cluster
    proxy: TcpProxy  # between the stalled replica and PostgreSQL
    run_id: UUID

    @property
    def limits(self) -> SessionLimits:
        """The stalled replica's session limits (the server derives them the same way)."""
        return SessionLimits.for_lease_ttl(self.cluster.timings.lease_ttl_s)


async def start(cluster: Cluster, name: str) -> Replicas:
    """Replica "server" (through a proxy) with one worker, "server-b" with two, one
    coordinator, and one run of TASKS short tasks under way."""
    target = urlsplit(cluster.dsn)
    assert target.hostname is not None and target.port is not None, cluster.dsn
    proxy = await TcpProxy(target.hostname, target.port).start()
    proxied = target._replace(netloc=f"{target.username}@{proxy.address}")
    await cluster.start_server(database_url=urlunsplit(proxied))
    other = await cluster.start_server("server-b", port=free_port())
    other_address = other.argv[other.argv.index("--listen") + 1]
    await cluster.start_coordinator()
    await cluster.start_worker("wa", concurrency=4)
    for worker in ("wb1", "wb2"):
        await cluster.start_worker(worker, concurrency=4, server=other_address)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(name, workload.independent(TASKS, sleep_ms=TASK_MS)),
    )
    return Replicas(cluster, proxy, run_id)


async def accepted(replicas: Replicas) -> tuple[datetime, int]:
    row = await replicas.cluster.fetchrow(
        "SELECT clock_timestamp() AS now, count(*) AS n FROM attempts"
        " WHERE run_id = $1 AND state = 'succeeded'",
        replicas.run_id,
    )
    assert row is not None
    return row["now"], row["n"]


async def catch_in_transaction(
    replicas: Replicas, stop: Callable[[], Awaitable[None]], go: Callable[[], None]
) -> datetime:
    """stop()s the replica until it is caught idle inside a transaction that another
    session waits for (go() and retry otherwise); returns when that transaction went
    idle, on the database clock: the moment the cluster began to wait for it.

    stop() returns once the stall has taken hold; what the replica sent just before it
    (a COMMIT on its way) may still arrive, so the transaction counts only if it is
    still the same one, still idle, once someone is seen waiting for it.

    Each try first lets the replica run until it is seen inside a transaction: stopped
    again the instant it is let go, it would barely run between tries and never open a
    new one (CI once spent all MAX_CATCHES tries in a few milliseconds that way)."""
    for _ in range(MAX_CATCHES):
        await _until_in_transaction(replicas)
        await stop()
        stalled = await _open_transaction(replicas)
        if (
            stalled is not None
            and await _blocks_someone(replicas, stalled["pid"])
            and await _still_open(replicas, stalled)
        ):
            since: datetime = stalled["state_change"]
            return since
        go()
    raise AssertionError(f"never caught the replica in a blocking transaction ({MAX_CATCHES}x)")


async def _open_transaction(replicas: Replicas) -> Record | None:
    """The stalled replica's backend that is idle inside a transaction that wrote, if any."""
    return await replicas.cluster.fetchrow(
        "SELECT pid, state_change FROM pg_stat_activity"
        " WHERE client_port = ANY($1::int[]) AND state = 'idle in transaction'"
        " AND backend_xid IS NOT NULL",
        replicas.proxy.upstream_ports(),
    )


async def _still_open(replicas: Replicas, stalled: Record) -> bool:
    again = await _open_transaction(replicas)
    return again is not None and tuple(again) == tuple(stalled)


async def _until_in_transaction(replicas: Replicas) -> None:
    """Polls without pause: the replica's transactions last milliseconds, shorter than
    wait_for's interval."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TRANSACTION_SEEN_WITHIN_S
    while await _open_transaction(replicas) is None:
        if loop.time() > deadline:
            raise AssertionError(
                f"the replica opened no transaction in {TRANSACTION_SEEN_WITHIN_S:.0f}s"
            )


async def _blocks_someone(replicas: Replicas, pid: int) -> bool:
    """Whether another session queues behind pid for a run row within a short window:
    the run lock is wanted every few milliseconds, so a transaction holding it is soon in
    someone's way. (The first waiter for a row holds its tuple lock while it waits.)"""

    async def blocking() -> bool:
        return bool(
            await replicas.cluster.fetchval(
                "SELECT count(*) > 0 FROM pg_locks"
                " WHERE locktype = 'tuple' AND relation = 'runs'::regclass"
                " AND $1 = ANY(pg_blocking_pids(pid))",
                pid,
            )
        )

    try:
        await wait_for(blocking, "another session to wait for the stalled one", within=0.3)
    except AssertionError:
        return False
    return True


async def measure_resume(replicas: Replicas, since: datetime) -> tuple[float, float]:
    """(resume, stall): seconds from `since` until results are accepted again, and until
    ACCEPTED_DURING_STALL of them are, while the replica is still stalled."""
    _, before = await accepted(replicas)

    async def progress(more: int) -> datetime | None:
        now, n = await accepted(replicas)
        return now if n >= before + more else None

    resumed = await wait_for(lambda: progress(1), "results to be accepted again", within=15)
    enough = await wait_for(
        lambda: progress(ACCEPTED_DURING_STALL), "the other replica to keep accepting"
    )
    return seconds_between(since, resumed), seconds_between(since, enough)


async def finish(replicas: Replicas, stall: str, resume_s: float, stalled_s: float) -> None:
    """Reports the figures, holds resume_s to the bound, and once the stalled replica
    is back, waits for the run to finish and checks the invariants."""
    bound = replicas.limits.stall_s
    report_figure(
        f"STALL server {stall}->results accepted again={resume_s:.2f}s (stall bound "
        f"{bound:.1f}s; stalled {stalled_s:.1f}s+, {ACCEPTED_DURING_STALL} accepted meanwhile)"
    )
    assert resume_s < 2 * bound + SLACK_S
    await wait_run(replicas.cluster, replicas.run_id)
    await replicas.cluster.check_invariants({replicas.run_id: Expect()})
