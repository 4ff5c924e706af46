"""awp_sdk.schedules against a real server: a schedule's whole life as typed records, a
bad cron expression as InvalidArgument naming the field, and a delayed start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from awp_db import workflows
from awp_db.connect import Pool
from awp_sdk import AsyncClient
from awp_sdk.errors import InvalidArgument, NotFound
from awp_sdk.schedules import Schedules
from kit import ADMIN_TOKEN, ServerHandle, spec


async def test_a_schedules_life_through_the_sdk(awp_server: ServerHandle, pool: Pool) -> None:
    await workflows.create(pool, spec("digest"))
    async with AsyncClient(awp_server.address, token=ADMIN_TOKEN) as client:
        schedules = Schedules(client)
        with pytest.raises(InvalidArgument) as caught:
            await schedules.create("nightly", "digest", cron="0 2 * *")
        assert [v.field for v in caught.value.violations] == ["cron"]

        nightly = await schedules.create(
            "nightly", "digest", cron="0 2 * * *", timezone="Europe/Paris", input={"n": 1}
        )
        assert (nightly.cron, nightly.every, nightly.overlap, nightly.catchup) == (
            "0 2 * * *",
            None,
            "skip",
            "all",
        )
        assert nightly.input == {"n": 1} and nightly.next_fire_at is not None
        every = await schedules.create(
            "reindex", "digest", every=timedelta(minutes=15), overlap="buffer_one"
        )
        assert every.every == timedelta(minutes=15) and every.overlap == "buffer_one"
        assert [s.name for s in await schedules.list()] == ["nightly", "reindex"]
        assert (await schedules.pause("nightly")).next_fire_at is None
        assert not (await schedules.resume("nightly")).paused

        run = await schedules.trigger("nightly")
        assert (await run.get()).run.input == {"n": 1}
        end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
        started, already = await schedules.backfill("reindex", end - timedelta(hours=1), end)
        assert (len(started), already) == (5, 0)
        ticks = (await schedules.get("nightly")).recent_ticks
        assert [(t.source, t.outcome) for t in ticks] == [("trigger", "started")]

        later = await client.start("digest", start_at=datetime.now(UTC) + timedelta(hours=1))
        detail = await later.get()
        assert detail.run.state == "running"
        assert [t.state for t in detail.tasks.values()] == ["pending"]

        await schedules.delete("reindex")
        with pytest.raises(NotFound):
            await schedules.get("reindex")
