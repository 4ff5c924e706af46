"""The admin token reaches the server from --token or AWP_TOKEN; without it, a clear refusal."""

from __future__ import annotations

from cli.runner import awp_async
from kit import ADMIN_TOKEN, ServerHandle


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
