"""docs/schedules.md's example runs as written: each `awp` line of its first ```sh block
against a real server, with a real coordinator leading in the background; then the
runs show the schedule's ticks, the trigger, the backfill and the delayed start."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
from datetime import UTC, datetime

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator
from awp_db import workflows
from awp_db.connect import Pool
from cli.runner import REPOSITORY, awp_async
from kit import ADMIN_TOKEN, ServerHandle, poll_until, spec

DOC = REPOSITORY / "docs" / "schedules.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands() -> list[list[str]]:
    block = BLOCK.search(DOC.read_text())
    assert block, "docs/schedules.md has no ```sh block"
    lines = [line for line in block[1].splitlines() if line and not line.startswith("#")]
    parsed = [shlex.split(line) for line in lines]
    assert all(words[0] == "awp" for words in parsed), lines
    return [words[1:] for words in parsed]


async def test_the_example_runs_as_written(
    awp_server: ServerHandle, pool: Pool, database_dsn: str
) -> None:
    await workflows.create(pool, spec("digest"))
    config = CoordinatorConfig(
        database_url=database_dsn, metrics_listen=None, instance="doc", scan_interval_s=0.5
    )
    stop = asyncio.Event()
    leading = asyncio.create_task(Coordinator(pool, config).run(stop))
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)
    try:
        for words in commands():
            if words[:2] == ["schedule", "get"]:
                # Let the every-second schedule fire a tick or two first.
                await poll_until(
                    lambda: pool.fetchval(
                        "SELECT count(*) >= 2 FROM runs WHERE started_by = 'schedule:every-second'"
                    ),
                    "ticks of every-second",
                )
            done = await awp_async(*target, *words)
            assert done.code == 0, (words, done.err)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await leading
    by_schedule = await pool.fetchval(
        "SELECT count(*) FROM runs WHERE started_by = 'schedule:every-second'"
    )
    assert by_schedule >= 2
    backfilled = await pool.fetch(
        "SELECT schedule_tick FROM runs WHERE schedule_tick < '2026-12-02' ORDER BY 1"
    )
    assert [r["schedule_tick"] for r in backfilled] == [
        datetime(2026, 12, 1, 0, 0, s, tzinfo=UTC) for s in range(5)
    ]
    triggered = await pool.fetchval(
        "SELECT count(*) FROM runs WHERE schedule_id IS NOT NULL"
        " AND started_by <> 'schedule:every-second' AND schedule_tick >= '2026-12-02'"
    )
    assert triggered == 1
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE awaiting_start") == 1
