"""Output streams (docs/design.md §15): how soon a chunk a worker writes reaches a reader,
and what 100 concurrent streams cost PostgreSQL.

* Latency: one task writes STAMPED chunks (the mock's ``stream_stamp``: each carries the
  wall-clock time of its write) every 20 ms; a reader (WatchStream, in this process)
  notes when each arrives. Chunk written -> delivered, p50/p99: the worker's linger and
  batch, AppendStream's fenced transaction, the NOTIFY, the reader's read of PostgreSQL.
* Load: STREAMS tasks at once, each writing a stamped chunk every 20 ms (50 chunks/s) for
  SECONDS s, each read by its own reader. Reported: chunks stored per second, delivery
  latency under that load, PostgreSQL transactions and WAL bytes per chunk (the worker
  batches, so far fewer than one transaction per chunk), and whether every reader got
  every chunk once, in order.
Both ends of a latency sample are this machine's wall clock.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cluster import Cluster, Window
from processes import percentile

from awp.v1 import control_pb2, runs_pb2, streams_pb2, types_pb2

EVERY_MS = 20
LATENCY_CHUNKS = 500
STREAMS = 100
SECONDS = 10


def _workflow(name: str, chunks: int) -> types_pb2.WorkflowDefinition:
    wf = types_pb2.WorkflowDefinition(name=name, version=1)
    task = wf.tasks.add(key="talk", executor_kind="mock", action="noop")
    task.input.update({"stream_chunks": chunks, "stream_every_ms": EVERY_MS, "stream_stamp": True})
    task.timeout.FromMilliseconds(600_000)
    return wf


async def _read(cluster: Cluster, run_id: str, latencies: list[float]) -> list[int]:
    """Reads the run's stream to its end; returns the positions received."""
    assert cluster.control is not None
    positions = []
    call = cluster.control.WatchStream(
        streams_pb2.WatchStreamRequest(run_id=run_id, task_key="talk")
    )
    async for answer in call:
        now = time.time()
        for chunk in answer.chunks:
            positions.append(chunk.position)
            written = float(chunk.text.split("@", 1)[1])
            latencies.append((now - written) * 1000)
    return positions


async def _wal(window: Window) -> int:
    value: int = await window.admin.fetchval(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
    )
    return value


async def stream_latency(cluster: Cluster, window: Window, streams: int) -> dict[str, Any]:
    assert cluster.control is not None
    control = cluster.control
    # One stream alone: the latency without load.
    (single,) = await cluster.start_runs(_workflow("stream-one", LATENCY_CHUNKS), 1)
    alone: list[float] = []
    got = await _read(cluster, str(single), alone)
    assert got == list(range(LATENCY_CHUNKS)), "a gap or a duplicate"
    # Many at once.
    chunks = SECONDS * 1000 // EVERY_MS
    wf = _workflow("stream-many", chunks)
    await control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=wf))
    await window.start()
    wal0 = await _wal(window)
    began = time.monotonic()
    loaded: list[float] = []
    run_ids = []
    for i in range(streams):
        answer = await control.StartRun(
            runs_pb2.StartRunRequest(workflow_name=wf.name, request_id=f"stream-{i}")
        )
        run_ids.append(answer.run.id)
    received = await asyncio.gather(*(_read(cluster, run_id, loaded) for run_id in run_ids))
    elapsed = time.monotonic() - began
    wal1 = await _wal(window)
    total = streams * chunks
    figures = await window.stop(total)
    figures["stream_ms_p50"] = percentile(alone, 50)
    figures["stream_ms_p99"] = percentile(alone, 99)
    figures["stream_loaded_ms_p50"] = percentile(loaded, 50)
    figures["stream_loaded_ms_p99"] = percentile(loaded, 99)
    figures["stream_chunks_per_s"] = total / elapsed
    figures["stream_xacts_per_chunk"] = figures["db_xacts_per_task"]
    figures["stream_wal_bytes_per_chunk"] = (wal1 - wal0) / total
    figures["stream_every_reader_whole"] = float(all(r == list(range(chunks)) for r in received))
    return figures
