"""A session PostgreSQL ended while this process could not read (stopped, or its loop
busy) surfaces, at the next command, as whatever asyncpg makes of the FATAL error it
finds waiting: the server answers UNAVAILABLE for every such form, never INTERNAL."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from awp_kernel.errors import ErrorKind
from awp_server.errors import as_awp_error


@pytest.mark.parametrize("loop_turns", [0, 1, 2, 3])
async def test_a_session_ended_while_stopped_is_unavailable(
    database_dsn: str, loop_turns: int
) -> None:
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute("SET idle_in_transaction_session_timeout = 100")
        transaction = conn.transaction()
        await transaction.start()
        await conn.fetchval("SELECT 1")
        # The process is stopped inside its transaction: nothing reads the socket while
        # PostgreSQL ends the idle session (a SIGSTOP, in the fault suite's stall test).
        time.sleep(0.6)  # noqa: ASYNC251 -- the stall itself: the loop must not run
        for _ in range(loop_turns):  # then the loop reads some of what arrived
            await asyncio.sleep(0)
        with pytest.raises(Exception) as raised:  # its form is what the test is about
            await transaction.commit()
        error = as_awp_error(raised.value)
        assert error is not None, f"{type(raised.value).__name__}: {raised.value}"
        assert error.kind is ErrorKind.UNAVAILABLE
    finally:
        conn.terminate()
