"""The console's one way to awp-server: the SDK's AsyncClient. One client (one channel)
serves every browser session; `AsyncClient.as_caller(token)` makes calls with a
session's credential. Answers are awp_sdk.records, failures awp_sdk.errors.

What is here is only what the console asks that no single SDK call answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Final

from awp_console.settings import Settings
from awp_sdk.client import AsyncClient
from awp_sdk.connection import Connection
from awp_sdk.errors import (
    AwpError,
    DeadlineExceeded,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from awp_sdk.records import Attempt, Event, Run, TaskStatus
from awp_sdk.streams import StreamItem

__all__ = [
    "UNREACHABLE",
    "AwpError",
    "NotFound",
    "PermissionDenied",
    "Unauthenticated",
    "all_attempts",
    "connect",
    "get_task",
    "watch",
    "watch_stream",
]

# No answer from awp-server at all (the browser's stream then reconnects and resumes).
UNREACHABLE: Final = (Unavailable, DeadlineExceeded)


def connect(settings: Settings) -> AsyncClient:
    """The console's client, with no credential of its own; create it inside the running
    event loop."""
    return AsyncClient(
        connection=Connection(
            address=settings.address,
            tls=settings.tls,
            tls_ca_file=settings.tls_ca_file,
            tls_cert_file=settings.tls_cert_file,
            tls_key_file=settings.tls_key_file,
            tls_server_name=settings.tls_server_name,
            timeout=settings.timeout,
        )
    )


async def get_task(client: AsyncClient, run_id: str, key: str) -> tuple[Run, TaskStatus | None]:
    """The run and one of its tasks (None: no such task) with its whole output, the other
    tasks' outputs not read."""
    detail = await client.get_run(run_id, outputs=False)
    found = detail.tasks.get(key)
    if found is not None and found.output_omitted:
        output = await client.get_task_output(run_id, key)
        found = dataclasses.replace(found, output=output, output_omitted=False)
    return detail.run, found


async def all_attempts(client: AsyncClient, run_id: str, key: str) -> list[Attempt]:
    # A task has at most its max_attempts and hand-backs (a few): every page, in order.
    return [attempt async for attempt in client.list_attempts(run_id, task_key=key)]


def watch(client: AsyncClient, run_id: str, after_seq: int) -> AsyncIterator[Event]:
    """The run's events after after_seq until it has ended. A broken stream is not
    resumed here: the browser reconnects with the last seq it got (Last-Event-ID)."""
    return client.watch(run_id, after_seq=after_seq, give_up_after=0)


def watch_stream(
    client: AsyncClient, run_id: str, task_key: str, from_offset: int
) -> AsyncIterator[StreamItem]:
    """The task's output stream from a position until the task has ended; like `watch`,
    a broken stream is resumed by the browser (Last-Event-ID), not here."""
    return client.task_stream(run_id, task_key, from_offset=from_offset, give_up_after=0)
