"""`awp run start --wait` / `awp run watch` keep following a run across a server restart:
the event stream resumes after the last seq seen, missing and repeating nothing."""

from __future__ import annotations

import asyncio
from uuid import UUID

from awp_cli.errors import Exit, exit_error
from awp_cli.follow import ProgressView, follow
from awp_db.connect import Pool
from awp_sdk.client import AsyncClient
from awp_sdk.connection import Connection as Target
from awp_sdk.enums import RunState, TaskState
from awp_sdk.errors import AwpError
from awp_sdk.records import Event, RunDetail
from kit import ADMIN_TOKEN, ServerFactory, poll_until, spec, start_run
from kit.db import drive_to_end, register


async def test_following_survives_a_server_restart(start_server: ServerFactory, pool: Pool) -> None:
    first = await start_server()
    run_id = await start_run(pool, spec("chain", tasks=3, chain=True))
    worker = await register(pool)
    events: list[Event] = []
    notes: list[str] = []
    snapshots: list[RunDetail] = []
    async with AsyncClient(connection=Target(address=first.address, token=ADMIN_TOKEN)) as client:
        following = asyncio.create_task(
            follow(
                client,
                str(run_id),
                on_event=events.append,
                on_snapshot=snapshots.append,
                on_reconnect=notes.append,
            )
        )

        async def seen(n: int) -> bool:
            return len(events) >= n

        await poll_until(lambda: seen(4))  # run.created and three task states
        await first.running.stop(0)
        # Progress while no server answers: the watcher must pick it up afterwards.
        await worker.complete_all(await worker.dispatch_and_claim())
        await poll_until(lambda: _truthy(notes))
        await start_server(listen=first.address)
        assert await drive_to_end(pool, UUID(str(run_id)), worker) == "succeeded"
        async with asyncio.timeout(30):
            final = await following

    assert final.run.state is RunState.SUCCEEDED
    assert [e.seq for e in events] == list(range(1, final.run.last_seq + 1))
    assert "resuming after seq" in notes[0]
    # The display's counts came from GetRun, and its last one is the final state.
    assert dict(snapshots[-1].run.task_counts) == {TaskState.SUCCEEDED: 3}
    view = ProgressView(final.run)
    view.on_snapshot(final)
    assert view.total == 3


async def _truthy(value: object) -> bool:
    return bool(value)


async def test_a_missing_run_is_not_retried(start_server: ServerFactory) -> None:
    server = await start_server()
    async with AsyncClient(connection=Target(address=server.address, token=ADMIN_TOKEN)) as client:
        try:
            async with asyncio.timeout(10):
                await follow(client, "00000000-0000-0000-0000-000000000000")
        except AwpError as failure:
            error = exit_error(failure)
            assert error.code == Exit.USAGE
            assert error.message.startswith("RUN_NOT_FOUND: ")
        else:
            raise AssertionError("following a missing run succeeded")


async def test_a_server_that_never_comes_back_is_given_up_on(
    start_server: ServerFactory, pool: Pool
) -> None:
    server = await start_server()
    run_id = await start_run(pool, spec("lonely"))
    async with AsyncClient(connection=Target(address=server.address, token=ADMIN_TOKEN)) as client:
        await server.running.stop(0)
        try:
            async with asyncio.timeout(20):
                await follow(client, str(run_id), give_up_after=1.0)
        except AwpError as failure:
            error = exit_error(failure)
            assert error.code == Exit.SERVER
            assert error.message.startswith(f"cannot reach awp-server at {server.address}")
        else:
            raise AssertionError("following without a server succeeded")
