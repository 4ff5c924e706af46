"""The per-run event log and revision: every state transaction of a run goes through here.

A transaction collects its events in an `EventBatch`; `flush` bumps each touched run's
revision exactly once and appends the events with contiguous seqs in one statement.
The caller must already hold the lock of every run it records events for (awp_db.locks),
which is what keeps seqs contiguous under concurrent writers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from awp_db.connect import Conn, Pool
from awp_db.queries import named, queries, rows_as
from awp_db.signals import RUN_EVENTS_CHANNEL

Q = queries("events")

# The append statement's per-event parameters, in the order flush builds each event's values.
_EVENT_COLUMNS = (
    "event_run_ids",
    "ords",
    "types",
    "task_keys",
    "attempts",
    "from_states",
    "to_states",
    "payloads",
)


@dataclass(frozen=True, slots=True)
class Event:
    run_id: UUID
    type: str
    task_key: str | None = None
    attempt: int | None = None
    from_state: str | None = None
    to_state: str | None = None
    payload: dict[str, Any] | None = None


class EventBatch:
    def __init__(self) -> None:
        self._events: dict[UUID, list[Event]] = defaultdict(list)
        self._notices: list[tuple[str, str]] = []

    def add(self, event: Event) -> None:
        self._events[event.run_id].append(event)

    def task(
        self,
        run_id: UUID,
        task_key: str,
        from_state: str | None,
        to_state: str,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        self.add(Event(run_id, "task.state", task_key, attempt, from_state, to_state, payload))

    def attempt(
        self,
        run_id: UUID,
        task_key: str,
        attempt: int,
        from_state: str | None,
        to_state: str,
        payload: dict[str, Any] | None = None,
    ) -> None:
        self.add(Event(run_id, "attempt.state", task_key, attempt, from_state, to_state, payload))

    def run(
        self,
        run_id: UUID,
        from_state: str | None,
        to_state: str,
        payload: dict[str, Any] | None = None,
    ) -> None:
        self.add(Event(run_id, "run.state", None, None, from_state, to_state, payload))

    def notify(self, channel: str, payload: str) -> None:
        """A notification to send with the events (in the same statement; delivered at
        commit like every NOTIFY), so a transaction pays one round trip for both."""
        self._notices.append((channel, payload))

    async def flush(self, conn: Conn) -> None:
        """Writes everything collected (once per transaction, before commit).

        One statement bumps the revisions, appends the events and sends the
        notifications (watchers of each run, plus any queued with `notify`).
        """
        channels = [channel for channel, _ in self._notices]
        payloads = [payload for _, payload in self._notices]
        self._notices.clear()
        if not self._events:
            if channels:
                await conn.execute(Q["notify"], channels, payloads)
            return
        run_ids = sorted(self._events)
        counts = [len(self._events[r]) for r in run_ids]
        columns: dict[str, list[Any]] = {name: [] for name in _EVENT_COLUMNS}
        for run_id in run_ids:
            for ordinal, event in enumerate(self._events[run_id], start=1):
                values = (
                    run_id,
                    ordinal,
                    event.type,
                    event.task_key,
                    event.attempt,
                    event.from_state,
                    event.to_state,
                    None if event.payload is None else json.dumps(event.payload),
                )
                for column, value in zip(columns.values(), values, strict=True):
                    column.append(value)
        # The run-events payload tells watchers which run moved; they re-read from their seq.
        await conn.execute(
            *named(
                Q["append"],
                run_ids=run_ids,
                counts=counts,
                **columns,
                run_events_channel=RUN_EVENTS_CHANNEL,
                channels=channels,
                channel_payloads=payloads,
            )
        )
        self._events.clear()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the log holds it: its seq and the revision of the run it came with."""

    run_id: UUID
    seq: int
    revision: int
    type: str
    task_key: str | None
    attempt: int | None
    from_state: str | None
    to_state: str | None
    payload: dict[str, Any]
    created_at: datetime


async def after_seq(
    conn: Conn | Pool, run_id: UUID, after: int, limit: int = 500
) -> list[StoredEvent]:
    return await rows_as(StoredEvent, conn, Q["after_seq"], run_id, after, limit)
