"""Following a run to its end: WatchRun events as they happen, GetRun for the counts.

The event stream is resumed from the last seq seen whenever it breaks (a server
restart, a load balancer dropping the stream), with capped, jittered backoff; it gives
up only after the server has been unreachable for `give_up_after` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import grpc
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from awp.v1 import control_pb2, types_pb2
from awp_cli import event_view, render
from awp_cli.client import TRANSIENT_CODES, Client, decode, failure, iterate
from awp_cli.errors import CliError, Exit
from awp_protocol.states import TERMINAL_TASK_STATES

# Bursts of events (a fan-out finishing) are coalesced into one GetRun at most this often.
REFRESH_INTERVAL_S: Final = 0.1
RECONNECT_INITIAL_S: Final = 0.1
RECONNECT_MAX_S: Final = 2.0

EventHandler = Callable[[types_pb2.StateEvent], None]
SnapshotHandler = Callable[[control_pb2.GetRunResponse], None]
ReconnectHandler = Callable[[str], None]


def run_exit(run: control_pb2.Run) -> Exit:
    return Exit.OK if run.state == types_pb2.RUN_STATE_SUCCEEDED else Exit.RUN_NOT_SUCCEEDED


async def get_run(client: Client, run_id: str) -> control_pb2.GetRunResponse:
    return await client.call(client.control.GetRun, control_pb2.GetRunRequest(run_id=run_id))


async def follow(
    client: Client,
    run_id: str,
    *,
    on_event: EventHandler | None = None,
    on_snapshot: SnapshotHandler | None = None,
    on_reconnect: ReconnectHandler | None = None,
    after_seq: int = 0,
    give_up_after: float = 60.0,
) -> control_pb2.GetRunResponse:
    """Streams the run's events until it is terminal; returns its final state."""
    changed = asyncio.Event()
    changed.set()
    refresher = (
        asyncio.create_task(_refresh(client, run_id, changed, on_snapshot))
        if on_snapshot is not None
        else None
    )
    try:
        last_seq = after_seq
        failing_since: float | None = None
        delay = RECONNECT_INITIAL_S
        while True:
            call = client.stream(
                client.control.WatchRun,
                control_pb2.WatchRunRequest(run_id=run_id, after_seq=last_seq),
            )
            try:
                async for answer in iterate(call):
                    failing_since, delay = None, RECONNECT_INITIAL_S
                    last_seq = answer.event.seq
                    if on_event is not None:
                        on_event(answer.event)
                    changed.set()
            except grpc.aio.AioRpcError as error:
                if error.code() not in TRANSIENT_CODES or decode(error).reason:
                    # The server answered and said no (e.g. RUN_NOT_FOUND): not worth a retry.
                    raise failure(error, client.target.address) from None
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up_after:
                    raise failure(error, client.target.address) from None
                if on_reconnect is not None:
                    on_reconnect(
                        f"stream lost ({error.code().name}); resuming after seq {last_seq}"
                    )
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            # The stream ends once the run is terminal; a server shutting down may also
            # end it early, so the run's state decides whether to resume.
            final = await get_run(client, run_id)
            if final.run.state not in (
                types_pb2.RUN_STATE_RUNNING,
                types_pb2.RUN_STATE_UNSPECIFIED,
            ):
                if on_snapshot is not None:
                    on_snapshot(final)
                return final
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher


async def _refresh(
    client: Client, run_id: str, changed: asyncio.Event, on_snapshot: SnapshotHandler
) -> None:
    while True:
        await changed.wait()
        changed.clear()
        began = time.monotonic()
        # A failed re-read is only a stale display: the stream decides about failures.
        with contextlib.suppress(CliError):
            on_snapshot(await get_run(client, run_id))
        # GetRun of a run with thousands of tasks is heavy: a display never costs the
        # server more than a fifth of its time.
        await asyncio.sleep(max(REFRESH_INTERVAL_S, 4 * (time.monotonic() - began)))


class ProgressView:
    """The live display of `awp run start --wait`: a bar, counts by state, recent events."""

    def __init__(self, run: control_pb2.Run, recent: int = 6) -> None:
        self.run = run
        self.total = max(1, sum(c.count for c in run.tasks_by_state))
        self.events: deque[Text] = deque(maxlen=recent)
        self.note = ""

    def on_snapshot(self, answer: control_pb2.GetRunResponse) -> None:
        self.run = answer.run
        self.total = max(1, len(answer.tasks))
        self.note = ""

    def on_event(self, event: types_pb2.StateEvent) -> None:
        if event.type in event_view.PROGRESS_EVENTS:
            self.events.append(event_view.event_line(event))

    def on_reconnect(self, why: str) -> None:
        self.note = why

    def __rich__(self) -> RenderableType:
        counts = render.task_counts(self.run)
        done = sum(n for state, n in counts.items() if state in TERMINAL_TASK_STATES)
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=self.total, completed=done, width=40),
            Text(f"{done}/{self.total} tasks done", style="bold"),
        )
        parts: list[RenderableType] = [render.run_header(self.run), bar, render.counts_text(counts)]
        if self.events:
            parts.append(Text(""))
            parts.extend(self.events)
        if self.note:
            parts.append(Text(self.note, style="yellow"))
        return Group(*parts)
