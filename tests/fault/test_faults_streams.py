"""Output streams under faults, with real processes (DESIGN.md §15): the writer killed
or frozen mid-stream, readers cut off, a server restarted, a reader on the other
replica. Each ends with the invariant check, whose stream rules (kit.stream_invariants)
say no chunk was stored after its lease ended and offsets are contiguous.

 S1 kill -9 the writer mid-stream: attempt 1's partial chunks, its end, attempt 2 whole
 S2 SIGSTOP the writer until its task runs elsewhere, then SIGCONT: nothing stale stored
 S3 a reader cut and resumed, a server restarted, the other replica: no gap, no duplicate
 S4 `awp run stream`, a reader process, kill -9'd and resumed with --from
 S5 PostgreSQL gone dark mid-stream (a partition): the writer waits, memory bounded
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import pytest
import workload
from cluster import Cluster, WorkerProcess, wait_for
from commandlines import ADMIN_TOKEN
from figures import report_figure
from probes import wait_attempt, wait_run
from process import Process
from proxy import TcpProxy
from streams import ENDED, STARTED, Reader, reading, texts

from awp.v1 import types_pb2
from awp_common.processes import command, free_port
from kit.invariants import Expect

pytestmark = pytest.mark.fault

KEY = "talk"


async def streaming_on_one_of_two(
    cluster: Cluster, name: str, chunks: int, every_ms: int
) -> tuple[UUID, WorkerProcess, WorkerProcess]:
    """Server, coordinator, two one-slot workers and a run of one task streaming `chunks`
    chunks `every_ms` apart; returns once attempt 1 stored 10, with its writer and the
    other worker."""
    await cluster.start_server()
    await cluster.start_coordinator()
    w1 = await cluster.start_worker("w1", concurrency=1)
    w2 = await cluster.start_worker("w2", concurrency=1)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            name,
            [workload.Task(KEY, input={"stream_chunks": chunks, "stream_every_ms": every_ms})],
        ),
    )
    first = await wait_attempt(cluster, run_id, KEY, 1, "running")
    await wait_for(lambda: stored(cluster, run_id, 1, at_least=10), "attempt 1's first chunks")
    writer = cluster.worker_of(first["worker_id"])
    return run_id, writer, w2 if writer is w1 else w1


async def stored(cluster: Cluster, run_id: UUID, attempt: int, at_least: int = 0) -> int | None:
    count: int = await cluster.fetchval(
        "SELECT count(*) FROM stream_chunks WHERE run_id = $1 AND attempt = $2", run_id, attempt
    )
    return count if count >= at_least else None


async def test_s1_killed_writer_partial_attempt_then_the_whole_retry(cluster: Cluster) -> None:
    chunks = 60
    run_id, victim, survivor = await streaming_on_one_of_two(cluster, "s1", chunks, 50)
    reader = Reader(run_id, KEY)
    reading_task = asyncio.create_task(reader.read(cluster.channel()))
    victim.process.kill()
    second = await wait_attempt(cluster, run_id, KEY, 2)
    assert second["worker_id"] == survivor.worker_id
    await wait_run(cluster, run_id)
    await asyncio.wait_for(reading_task, 30)

    partial = [c for c in reader.chunks if c.attempt == 1]
    assert 10 <= len(partial) < chunks
    assert texts(partial) == [f"1:{i} " for i in range(len(partial))]
    assert texts([c for c in reader.chunks if c.attempt == 2]) == [f"2:{i} " for i in range(chunks)]
    assert reader.positions() == list(range(len(partial) + chunks))
    assert reader.boundaries == [
        (1, STARTED, 0),
        (1, ENDED, types_pb2.ATTEMPT_STATE_INTERRUPTED),
        (2, STARTED, 0),
        (2, ENDED, types_pb2.ATTEMPT_STATE_SUCCEEDED),
    ]
    # Framed in order: attempt 1's chunks, its end, attempt 2's start, its chunks.
    kinds = [(kind, attempt) for kind, attempt, _ in reader.log if kind == "boundary"]
    ended_1 = reader.log.index(("boundary", 1, ENDED))
    started_2 = reader.log.index(("boundary", 2, STARTED))
    assert all(e[2] == 1 for e in reader.log[:ended_1] if e[0] == "chunk"), kinds
    assert all(e[2] == 2 for e in reader.log[started_2:] if e[0] == "chunk")
    report_figure(f"STREAM kill -9: attempt 1 left {len(partial)} of {chunks} chunks")
    await cluster.check_invariants({run_id: Expect()})


async def test_s2_frozen_writer_stores_nothing_after_its_lease(cluster: Cluster) -> None:
    run_id, zombie, other = await streaming_on_one_of_two(cluster, "s2", 200, 20)
    zombie.process.signal(signal.SIGSTOP)
    try:
        second = await wait_attempt(cluster, run_id, KEY, 2, within=20)
        # Attempt 2 exists only once attempt 1's lease was settled: its stream is closed.
        at_revocation = await stored(cluster, run_id, 1)
    finally:
        zombie.process.signal(signal.SIGCONT)
    assert second["worker_id"] == other.worker_id
    await wait_run(cluster, run_id)

    async def zombie_stood_down() -> bool:
        return any(
            [
                await zombie.process.logged("output stream stopped"),
                await zombie.process.logged("safety deadline passed"),
                await zombie.process.logged("lease lost"),
            ]
        )

    await wait_for(zombie_stood_down, "the resumed writer to give up its stale attempt")
    assert await stored(cluster, run_id, 1) == at_revocation
    first = await wait_attempt(cluster, run_id, KEY, 1)
    late = await cluster.fetchval(
        "SELECT count(*) FROM stream_chunks WHERE dispatch_id = $1 AND created_at >= $2",
        first["dispatch_id"],
        first["finished_at"],
    )
    assert late == 0
    reader = Reader(run_id, KEY)
    await asyncio.wait_for(reader.read(cluster.channel()), 30)
    assert len([c for c in reader.chunks if c.attempt == 1]) == at_revocation
    assert texts([c for c in reader.chunks if c.attempt == 2]) == [f"2:{i} " for i in range(200)]
    report_figure(f"STREAM SIGSTOP: stale attempt stored {at_revocation} chunks, 0 after its lease")
    await cluster.check_invariants({run_id: Expect()})


async def test_s3_readers_resume_across_cuts_restarts_and_replicas(cluster: Cluster) -> None:
    await cluster.start_server()
    replica = await cluster.start_server("server-b", port=free_port())
    replica_address = replica.argv[replica.argv.index("--listen") + 1]
    await cluster.start_coordinator()
    await cluster.start_worker("w1", concurrency=1)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "s3", [workload.Task(KEY, input={"stream_chunks": 100, "stream_every_ms": 40})]
        ),
    )
    on_a, on_b = cluster.channel(), cluster.channel(replica_address)
    reader = Reader(run_id, KEY)
    # A reader on the replica the writer does not use, killed after 10 chunks...
    async with reading(reader, on_b):
        await wait_for(lambda: len(reader.chunks) >= 10, "10 chunks on the other replica")
    cut_at = reader.next_offset
    # ...resumed from its last offset, through the writer's server, which is then
    # killed and restarted mid-stream: the reader moves on, alternating replicas.
    resuming = asyncio.create_task(reader.read_resuming([on_a, on_b], within=90))
    await wait_for(lambda: len(reader.chunks) >= cut_at + 10, "10 more chunks after resuming")
    await cluster.restart("server", graceful=False)
    await wait_run(cluster, run_id, within=60)
    await resuming

    rows = await cluster.fetch(
        """SELECT c.position, c.data FROM stream_chunks c JOIN tasks t ON t.id = c.task_id
            WHERE c.run_id = $1 AND t.key = $2 ORDER BY c.position""",
        run_id,
        KEY,
    )
    assert reader.positions() == [row["position"] for row in rows], "a gap or a duplicate"
    assert texts(reader.chunks) == [row["data"] for row in rows]
    assert reader.positions() == list(range(len(rows)))
    assert reader.connections >= 3
    report_figure(f"STREAM resume: {len(rows)} chunks over {reader.connections} connections")
    await cluster.check_invariants({run_id: Expect()})


async def test_s4_cli_reader_killed_and_resumed_from_its_last_position(cluster: Cluster) -> None:
    """`awp run stream --json`, a real reader process, kill -9'd mid-stream and started
    again with --from its last position + 1: together they print every chunk once."""
    await cluster.start_server()
    await cluster.start_coordinator()
    await cluster.start_worker("w1", concurrency=1)
    run_id = await workload.start(
        cluster.control(),
        workload.definition(
            "s4", [workload.Task(KEY, input={"stream_chunks": 80, "stream_every_ms": 40})]
        ),
    )

    def reader(name: str, *extra: str) -> Process:
        process = cluster.add(
            name,
            [
                *command("awp"),
                "--address",
                cluster.server_address,
                "--token",
                ADMIN_TOKEN,
                "run",
                "stream",
                str(run_id),
                KEY,
                "--json",
                *extra,
            ],
        )
        process.spawn()
        return process

    def printed(process: Process) -> list[int]:
        return [
            line["position"]
            for line in process.json_lines()
            if "position" in line and ("text" in line or "json" in line)
        ]

    first = reader("reader-1")
    await wait_for(lambda: len(printed(first)) >= 15, "the first reader's 15 chunks")
    first.kill()
    await first.wait_exit(10)
    seen = printed(first)
    second = reader("reader-2", "--from", str(seen[-1] + 1))
    assert await second.wait_exit(60) == 0, second.tail()
    await wait_run(cluster, run_id)
    stored_positions = [
        row["position"]
        for row in await cluster.fetch(
            "SELECT position FROM stream_chunks WHERE run_id = $1 ORDER BY position", run_id
        )
    ]
    assert seen + printed(second) == stored_positions == list(range(80))
    report_figure(f"STREAM CLI reader kill -9 at {len(seen)} chunks, resumed: 80 once each")
    await cluster.check_invariants({run_id: Expect()})


# --- S5 a database gone dark mid-stream: the writer waits, its memory stays bounded ---

S5_CHUNKS = 3_000
S5_CHUNK_BYTES = 4_000  # 12 MB offered per attempt: far past the writer's 1 MiB buffer
S5_STALL_S = 3.0
# What the worker may grow over its idle size while streaming and while it cannot store
# anything: its 1 MiB buffer, the batch in flight, and the noise of a Python process. An
# unbounded buffer would hold most of the 12 MB offered (the mock writes far faster than
# the proxy lets appends through).
S5_GROWTH_BOUND_MB = 6.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def test_s5_a_stalled_database_does_not_grow_the_writers_memory(cluster: Cluster) -> None:
    target = urlsplit(cluster.dsn)
    assert target.hostname is not None and target.port is not None, cluster.dsn
    proxy = await TcpProxy(target.hostname, target.port).start()
    try:
        proxied = target._replace(netloc=f"{target.username}@{proxy.address}")
        await cluster.start_server(database_url=urlunsplit(proxied))
        await cluster.start_coordinator()
        writer = await cluster.start_worker("w1", concurrency=1)
        pid = writer.process.pid
        assert pid is not None
        idle = rss_mb(pid)
        task_input = {"stream_chunks": S5_CHUNKS, "stream_chunk_bytes": S5_CHUNK_BYTES}
        run_id = await workload.start(
            cluster.control(), workload.definition("s5", [workload.Task(KEY, input=task_input)])
        )
        await wait_for(lambda: stored(cluster, run_id, 1, at_least=200), "the stream under way")
        during = [rss_mb(pid)]
        proxy.partition()
        try:
            stalled_at = await cluster.fetchval("SELECT count(*) FROM stream_chunks")
            deadline = asyncio.get_running_loop().time() + S5_STALL_S
            while asyncio.get_running_loop().time() < deadline:
                during.append(rss_mb(pid))
                await asyncio.sleep(0.05)
            # Nothing was stored through the dark proxy: the writer has been waiting.
            assert await cluster.fetchval("SELECT count(*) FROM stream_chunks") == stalled_at
        finally:
            proxy.heal()
        await wait_run(cluster, run_id, within=120)
    finally:
        await proxy.close()
    growth = max(during) - idle
    report_figure(
        f"STREAM stalled database: worker RSS {idle:.1f} MB idle -> at most {max(during):.1f} MB "
        f"over a {S5_STALL_S:.0f} s stall (+{growth:.1f} MB), "
        f"{S5_CHUNKS * S5_CHUNK_BYTES / 1e6:.0f} MB offered"
    )
    assert growth < S5_GROWTH_BOUND_MB
    # Nothing dropped: the attempt that succeeded stored every chunk, in order.
    last = await cluster.fetchval(
        "SELECT max(attempt) FROM attempts WHERE run_id = $1 AND state = 'succeeded'", run_id
    )
    assert await stored(cluster, run_id, last) == S5_CHUNKS
    await cluster.check_invariants({run_id: Expect()})
