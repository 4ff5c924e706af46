"""A parked Claim wakes on the coordinator's channel only for what may have made a task
ready (awp_db.signals.MAY_READY), not for every registration, drain or lost stream of a
large fleet (awp_db.listen.Relay), over a real LISTEN connection."""

from __future__ import annotations

from awp_db.connect import Pool
from awp_db.listen import Inbox, Listener, Relay, Waiter
from awp_db.signals import COORDINATOR_CHANNEL, MAY_READY, RUN_STARTED
from kit import poll_until


async def test_a_relay_wakes_its_waiter_only_for_its_payloads(
    pool: Pool, database_dsn: str
) -> None:
    listener = Listener(database_dsn, [COORDINATOR_CHANNEL])
    await listener.start()
    try:
        assert await listener.wait_connected(30)
        parked = Waiter(None)
        seen = Inbox(limit=10)
        async with (
            listener.attach(COORDINATOR_CHANNEL, Relay(parked, MAY_READY)),
            listener.attach(COORDINATOR_CHANNEL, seen),
        ):
            for payload in ("register", "drain", "stream_lost", "sentinel"):
                await pool.execute("SELECT pg_notify($1, $2)", COORDINATOR_CHANNEL, payload)
            # Delivered in order: once the sentinel is in, the three before it were too.
            await poll_until(lambda: "sentinel" in seen.take()[0], "the sentinel")
            assert not await parked.wait(0)
            await pool.execute("SELECT pg_notify($1, $2)", COORDINATOR_CHANNEL, RUN_STARTED)
            assert await parked.wait(30)
    finally:
        await listener.stop()
