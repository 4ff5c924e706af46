"""A run's events from a given seq to its end, across reconnects.

WatchRun streams every event after `after_seq`, then live ones, and ends once the run is
terminal. When the stream breaks (a server restart, a load balancer dropping it) it is
opened again after the last seq seen, with capped, jittered backoff, so nothing is
missed or repeated; it gives up only after the server has been unreachable for
`give_up_after` seconds. An answer from AWP's handlers (RUN_NOT_FOUND...) is not retried.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import grpc

from awp.v1 import runs_pb2, types_pb2
from awp_sdk.connection import Channel, iterate
from awp_sdk.errors import DeadlineExceeded, Unavailable, is_transient

RECONNECT_INITIAL_S: Final = 0.1
RECONNECT_MAX_S: Final = 2.0
GIVE_UP_AFTER_S: Final = 60.0

ReconnectHandler = Callable[[str], None]


async def run_events(
    channel: Channel,
    run_id: str,
    *,
    after_seq: int = 0,
    give_up_after: float = GIVE_UP_AFTER_S,
    on_reconnect: ReconnectHandler | None = None,
) -> AsyncIterator[types_pb2.StateEvent]:
    """Every event of the run with seq > after_seq, in order, until the run has ended."""
    last_seq = after_seq
    failing_since: float | None = None
    delay = RECONNECT_INITIAL_S

    async def pause(error: Exception, code: grpc.StatusCode | None) -> None:
        """Waits before the next try; raises error once the server has been away too long."""
        nonlocal failing_since, delay
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > give_up_after:
            raise error
        if on_reconnect is not None:
            what = code.name if code is not None else type(error).__name__
            on_reconnect(f"stream lost ({what}); resuming after seq {last_seq}")
        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, RECONNECT_MAX_S)

    while True:
        call = channel.stream(
            channel.control.WatchRun,
            runs_pb2.WatchRunRequest(run_id=run_id, after_seq=last_seq),
        )
        try:
            async for answer in iterate(call):
                failing_since, delay = None, RECONNECT_INITIAL_S
                last_seq = answer.event.seq
                yield answer.event
        except grpc.aio.AioRpcError as error:
            if not is_transient(error):
                raise channel.error(error) from None
            await pause(channel.error(error), error.code())
            continue
        # The stream ends once the run is terminal; a server shutting down may also end it
        # early, so the run's state decides whether to resume.
        try:
            now = await channel.call(channel.control.GetRun, runs_pb2.GetRunRequest(run_id=run_id))
        except (Unavailable, DeadlineExceeded) as error:
            await pause(error, error.code)
            continue
        if now.run.state not in (types_pb2.RUN_STATE_RUNNING, types_pb2.RUN_STATE_UNSPECIFIED):
            return
