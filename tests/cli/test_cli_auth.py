"""The admin token reaches the server from --token or AWP_TOKEN; without it, a clear refusal."""

from __future__ import annotations

import asyncio
import sys

from cli.runner import ENV, REPOSITORY, Result
from kit import ADMIN_TOKEN, ServerHandle


async def awp_async(*args: str, env: dict[str, str] | None = None) -> Result:
    # The server runs on this test's event loop: the CLI must not block it.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "awp_cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV | (env or {}),
        cwd=REPOSITORY,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


async def test_the_admin_token_is_sent(awp_server: ServerHandle) -> None:
    address = awp_server.address
    refused = await awp_async("--address", address, "workers")
    assert refused.code == 2
    assert refused.err.splitlines() == [
        "awp: TOKEN_INVALID: missing or unknown credential (authorization: Bearer "
        "<token>, or a client certificate a credential names)",
        "  hint: pass the admin token with --token or AWP_TOKEN",
    ]
    flag = await awp_async("workers", "--address", address, "--token", ADMIN_TOKEN, "--json")
    assert flag.code == 0 and flag.json() == {}
    env = await awp_async("stats", env={"AWP_ADDRESS": address, "AWP_TOKEN": ADMIN_TOKEN})
    assert env.code == 0 and "active leases" in env.out
