"""Following a run to its end: WatchRun events as they happen, GetRun for the counts.

The events come from the SDK's watch, resumed from the last seq seen whenever it breaks;
it gives up only after the server has been unreachable for `give_up_after` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from awp_cli import event_view
from awp_cli.errors import Exit
from awp_cli.render import counts_text
from awp_cli.render_runs import run_header, task_counts
from awp_protocol.states import TERMINAL_TASK_STATES
from awp_sdk.client import AsyncClient
from awp_sdk.enums import RunState
from awp_sdk.errors import AwpError
from awp_sdk.records import Event, Run, RunDetail
from awp_sdk.watch import GIVE_UP_AFTER_S

# Bursts of events (a fan-out finishing) are coalesced into one GetRun at most this often.
REFRESH_INTERVAL_S: Final = 0.1

EventHandler = Callable[[Event], None]
SnapshotHandler = Callable[[RunDetail], None]


def run_exit(run: Run) -> Exit:
    return Exit.OK if run.state is RunState.SUCCEEDED else Exit.RUN_NOT_SUCCEEDED


async def get_run(client: AsyncClient, run_id: str) -> RunDetail:
    # One GetRun: a display shows no large output, and reading them all would cost more.
    return await client.get_run(run_id, outputs=False)


async def follow(
    client: AsyncClient,
    run_id: str,
    *,
    on_event: EventHandler | None = None,
    on_snapshot: SnapshotHandler | None = None,
    on_reconnect: Callable[[str], None] | None = None,
    after_seq: int = 0,
    give_up_after: float = GIVE_UP_AFTER_S,
) -> RunDetail:
    """Streams the run's events until it is terminal; returns its final state."""
    changed = asyncio.Event()
    changed.set()
    refresher = (
        asyncio.create_task(_refresh(client, run_id, changed, on_snapshot))
        if on_snapshot is not None
        else None
    )
    try:
        async for event in client.watch(
            run_id, after_seq=after_seq, give_up_after=give_up_after, on_reconnect=on_reconnect
        ):
            if on_event is not None:
                on_event(event)
            changed.set()
        final = await get_run(client, run_id)
        if on_snapshot is not None:
            on_snapshot(final)
        return final
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher


async def _refresh(
    client: AsyncClient, run_id: str, changed: asyncio.Event, on_snapshot: SnapshotHandler
) -> None:
    while True:
        await changed.wait()
        changed.clear()
        began = time.monotonic()
        # A failed re-read is only a stale display: the stream decides about failures.
        with contextlib.suppress(AwpError):
            on_snapshot(await get_run(client, run_id))
        # GetRun of a run with thousands of tasks is heavy: a display never costs the
        # server more than a fifth of its time.
        await asyncio.sleep(max(REFRESH_INTERVAL_S, 4 * (time.monotonic() - began)))


class ProgressView:
    """The live display of `awp run start --wait`: a bar, counts by state, recent events."""

    def __init__(self, run: Run, recent: int = 6) -> None:
        self.run = run
        self.total = max(1, run.task_count)
        self.events: deque[Text] = deque(maxlen=recent)
        self.note = ""

    def on_snapshot(self, detail: RunDetail) -> None:
        self.run = detail.run
        self.total = max(1, len(detail.tasks))
        self.note = ""

    def on_event(self, event: Event) -> None:
        if event.type in event_view.PROGRESS_EVENTS:
            self.events.append(event_view.event_line(event))

    def on_reconnect(self, why: str) -> None:
        self.note = why

    def __rich__(self) -> RenderableType:
        counts = task_counts(self.run)
        done = sum(n for state, n in counts.items() if state in TERMINAL_TASK_STATES)
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=self.total, completed=done, width=40),
            Text(f"{done}/{self.total} tasks done", style="bold"),
        )
        parts: list[RenderableType] = [run_header(self.run), bar, counts_text(counts)]
        if self.events:
            parts.append(Text(""))
            parts.extend(self.events)
        if self.note:
            parts.append(Text(self.note, style="yellow"))
        return Group(*parts)
