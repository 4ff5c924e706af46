"""`awp limits ...` as a user runs it: set (a period refused naming it), get with the
units used now, list, --json through awp_sdk.wire, an unknown limit NOT_FOUND."""

from __future__ import annotations

from cli.runner import awp_async
from kit import ADMIN_TOKEN, ServerHandle


async def test_limits_commands(awp_server: ServerHandle) -> None:
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)

    none = await awp_async(*target, "limits", "list")
    assert none.code == 0 and "no rate limits" in none.out
    made = await awp_async(*target, "limits", "set", "openai-tpm", "90000", "--per", "1m")
    assert made.code == 0, made.err
    assert "openai-tpm" in made.out and "90,000" in made.out
    changed = await awp_async(
        *target, "limits", "set", "openai-tpm", "60000", "--per", "1m", "--json"
    )
    assert changed.code == 0, changed.err
    spec = changed.json()["limit"]["spec"]
    assert (spec["units"], spec["period"]) == ("60000", "60s")

    shown = await awp_async(*target, "limits", "get", "openai-tpm", "--json")
    assert shown.code == 0 and shown.json()["limit"]["spec"]["name"] == "openai-tpm"
    listed = await awp_async(*target, "limits", "list", "--json")
    assert [limit["spec"]["name"] for limit in listed.json()["limits"]] == ["openai-tpm"]

    missing = await awp_async(*target, "limits", "get", "nope")
    assert missing.code != 0 and "rate limit 'nope'" in missing.err
    bad = await awp_async(*target, "limits", "set", "x", "5", "--per", "0s")
    assert bad.code == 2 and "per" in bad.err
