"""`awp schedule ...` as a user runs it: create (a bad cron expression refused naming the
field), list with next fire times, show, pause, resume, trigger, backfill, delete; and
`awp run start --in` for a delayed start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from awp_db import workflows
from awp_db.connect import Pool
from cli.runner import awp_async
from kit import ADMIN_TOKEN, ServerHandle, spec


async def test_schedule_commands(awp_server: ServerHandle, pool: Pool) -> None:
    await workflows.create(pool, spec("digest"))
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)

    bad = await awp_async(
        *target, "schedule", "create", "nightly", "digest", "--cron", "0 25 * * *"
    )
    assert bad.code == 2
    assert "cron" in bad.err and "five-field" in bad.err

    made = await awp_async(
        *target, "schedule", "create", "nightly", "digest", "--cron", "0 2 * * *",
        "--timezone", "Europe/Paris", "--input", '{"lang": "en"}',
    )  # fmt: skip
    assert made.code == 0, made.err
    assert "0 2 * * * (Europe/Paris)" in made.out
    every = await awp_async(
        *target, "schedules", "create", "reindex", "digest", "--every", "15m", "--overlap",
        "buffer-one", "--json",
    )  # fmt: skip
    assert every.code == 0, every.err
    assert every.json()["schedule"]["spec"]["interval"] == "900s"

    listed = await awp_async(*target, "schedule", "list")
    assert listed.code == 0, listed.err
    assert "nightly" in listed.out and "every 0:15:00" in listed.out

    paused = await awp_async(*target, "schedule", "pause", "nightly")
    assert paused.code == 0 and "paused" in paused.out
    assert (await awp_async(*target, "schedule", "resume", "nightly")).code == 0

    triggered = await awp_async(*target, "schedule", "trigger", "nightly")
    assert triggered.code == 0, triggered.err
    run = await awp_async(*target, "run", "get", triggered.out.strip(), "--json")
    assert run.json()["run"]["scheduleId"]

    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    back = await awp_async(
        *target, "schedule", "backfill", "reindex",
        "--start", (end - timedelta(minutes=30)).isoformat(), "--end", end.isoformat(),
    )  # fmt: skip
    assert back.code == 0, back.err
    assert len(back.out.split()) == 3 and "3 runs; 0 ticks had fired" in back.err
    shown = await awp_async(*target, "schedule", "get", "reindex")
    assert shown.code == 0 and "backfill" in shown.out

    assert (await awp_async(*target, "schedule", "delete", "nightly")).code == 0
    gone = await awp_async(*target, "schedule", "get", "nightly")
    assert gone.code == 2 and "SCHEDULE_NOT_FOUND" in gone.err

    later = await awp_async(*target, "run", "start", "digest", "--in", "1h", "--json")
    assert later.code == 0, later.err
    assert later.json()["run"]["startTime"]
