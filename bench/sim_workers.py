"""Idle worker sessions, many in one process: the load of a fleet of awp-workers that
hold no lease, without a process (and ~40 MB) per worker.

    python bench/sim_workers.py --sessions 5000 --server 127.0.0.1:50051 --stats FILE

Each session does what awp-worker does while idle (worker/awp_worker/_session.py,
_heartbeat.py): Register, then one Heartbeat stream kept open, a heartbeat written every
heartbeat_interval the server granted, answers read by a separate reader. It holds no
lease and never claims. Sessions open a bounded number at a time; once all are
heartbeating it prints READY. FILE is rewritten every STATS_EVERY_S with the counts
(opened, heartbeating, sent, answered) and the wall-clock time they were taken.
Any session that fails ends the process with its error.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from awp.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from awp_protocol.limits import PROTOCOL_VERSION

# HTTP/2 multiplexes streams on one connection, but one connection is one socket and one
# server-side reader: spread the sessions over several.
SESSIONS_PER_CHANNEL = 250
OPENING_AT_ONCE = 100  # sessions between Register and their first answer, at most
RPC_TIMEOUT_S = 10.0  # awp-worker's default --rpc-timeout
DEFAULT_INTERVAL_S = 5.0  # what awp-worker assumes until Register says otherwise
STATS_EVERY_S = 0.25
# awp-worker's executor kinds are its settings; any valid kind will do for an idle one.
KIND = "sim"
# awp-worker's default --concurrency: the session looks like a default worker's.
MAX_CONCURRENCY = 8

HeartbeatCall = grpc.aio.StreamStreamCall[worker_pb2.HeartbeatRequest, worker_pb2.HeartbeatResponse]


@dataclass
class Counts:
    sessions: int
    opened: int = 0  # sessions whose first heartbeat was answered
    sent: int = 0  # heartbeats written, the opening ones included
    answered: int = 0
    at: float = 0.0  # time.time() when taken: the reader computes rates with it


async def _read(call: HeartbeatCall, counts: Counts) -> None:
    while True:
        answer = await call.read()
        if answer is grpc.aio.EOF:
            raise RuntimeError("the server ended a heartbeat stream")
        assert isinstance(answer, worker_pb2.HeartbeatResponse)
        # A session the server no longer counts as active would heartbeat for nothing.
        if answer.session_state != types_pb2.WORKER_STATE_ACTIVE:
            raise RuntimeError(f"session state {answer.session_state} from the server")
        counts.answered += 1


async def _write(
    call: HeartbeatCall,
    beat: worker_pb2.HeartbeatRequest,
    interval: float,
    phase: float,
    counts: Counts,
) -> None:
    # Sessions opened together would heartbeat together forever: a fleet's workers start
    # at unrelated times, so each takes a random phase within one interval.
    await asyncio.sleep(phase)
    while True:
        await call.write(beat)
        counts.sent += 1
        # Paced by the writer alone, as in awp-worker: waiting for the answer first
        # would align every session answered by one coalesced write with the others.
        await asyncio.sleep(interval)


async def _session(
    stub: worker_pb2_grpc.WorkerServiceAsyncStub,
    index: int,
    counts: Counts,
    opening: asyncio.Semaphore,
) -> None:
    async with opening:
        registered = await stub.Register(
            worker_pb2.RegisterRequest(
                name=f"sim-{index}",
                protocol_version=PROTOCOL_VERSION,
                executor_kinds=[KIND],
                max_concurrency=MAX_CONCURRENCY,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        granted = registered.heartbeat_interval
        interval = granted.seconds + granted.nanos / 1e9 or DEFAULT_INTERVAL_S
        call: HeartbeatCall = stub.Heartbeat()
        beat = worker_pb2.HeartbeatRequest(session=registered.session)
        # A session counts as open once the server has answered a heartbeat: by then
        # it has authenticated the stream and recorded the heartbeat.
        await call.write(beat)
        counts.sent += 1
        first = await asyncio.wait_for(call.read(), RPC_TIMEOUT_S)
        if first is grpc.aio.EOF:
            raise RuntimeError("the server ended a heartbeat stream at once")
        counts.answered += 1
        counts.opened += 1
    phase = random.Random(index).uniform(0.0, interval)
    async with asyncio.TaskGroup() as group:
        group.create_task(_read(call, counts))
        group.create_task(_write(call, beat, interval, phase, counts))


def _publish(counts: Counts, path: Path | None) -> None:
    counts.at = time.time()
    if path is not None:
        # Written whole and renamed, so a reader never sees half a file.
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(counts)))
        os.replace(partial, path)


async def simulate(server: str, sessions: int, stats: Path | None, at_once: int) -> None:
    # Sessions share their channel's socket, so descriptors only matter far beyond
    # 5,000 sessions: headroom, not a need.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # A local subchannel pool: each channel its own connection, not one shared one.
    options = [("grpc.use_local_subchannel_pool", 1)]
    count = -(-sessions // SESSIONS_PER_CHANNEL)
    channels = [grpc.aio.insecure_channel(server, options=options) for _ in range(count)]
    # An aio channel makes the generated stub asynchronous (its .pyi says so).
    stubs = [worker_pb2_grpc.WorkerServiceStub(channel) for channel in channels]
    counts = Counts(sessions)
    opening = asyncio.Semaphore(at_once)
    # One future for the first session to end (always with an error): waiting on all
    # the tasks instead would cost a callback per session every STATS_EVERY_S.
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(task: asyncio.Task[None]) -> None:
        if not ended.done() and not task.cancelled():
            ended.set_exception(task.exception() or RuntimeError("a session ended"))

    started = time.monotonic()
    running = []  # referenced, so no session task is collected mid-flight
    for i in range(sessions):
        task = asyncio.create_task(_session(stubs[i // SESSIONS_PER_CHANNEL], i, counts, opening))
        task.add_done_callback(end)
        running.append(task)
    ready = False
    while True:
        await asyncio.wait([ended], timeout=STATS_EVERY_S)
        _publish(counts, stats)
        if ended.done():
            ended.result()
        if not ready and counts.opened == sessions:
            ready = True
            took = time.monotonic() - started
            print(f"READY {sessions} sessions heartbeating after {took:.1f} s", flush=True)
            # Everything built so far lives until the end: out of the collector's sight,
            # full collections no longer walk it (pauses of ~0.3 s measured at 5,000).
            gc.freeze()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, required=True, metavar="N")
    parser.add_argument("--server", required=True, metavar="HOST:PORT")
    parser.add_argument("--stats", type=Path, default=None, metavar="FILE")
    parser.add_argument(
        "--opening", type=int, default=OPENING_AT_ONCE, metavar="K", help="sessions opening at once"
    )
    args = parser.parse_args()
    try:
        asyncio.run(simulate(args.server, args.sessions, args.stats, args.opening))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        # The usual end: the server stopped first and ended the streams.
        print(f"simulation ended: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
