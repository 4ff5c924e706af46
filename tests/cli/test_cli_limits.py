"""`awp limits ...` as a user runs it: set (a period refused naming it), get with the
units used now, list, --json through awp_sdk.wire, an unknown limit NOT_FOUND; and
`awp run get` saying which limit holds a task back."""

from __future__ import annotations

from awp_db import workflows
from awp_db.connect import Pool
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from cli.runner import awp_async
from kit import ADMIN_TOKEN, ServerHandle, start_run
from kit.db import dispatch_all, register


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


async def test_run_get_says_what_holds_a_task_back(awp_server: ServerHandle, pool: Pool) -> None:
    """A task whose concurrency key is full: `awp run get` shows the key and its count,
    --json the same words in Task.waiting_for."""
    workflow = validate(
        WorkflowSpec(
            name="held",
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    concurrency_limits=(ConcurrencyLimit("user:{input.user}", 1),),
                )
                for i in range(2)
            ),
        )
    )
    run_id = await start_run(pool, workflow, run_input={"user": "ann"})
    await register(pool)
    assert await dispatch_all(pool) == 1
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)
    shown = await awp_async(*target, "run", "get", str(run_id))
    assert shown.code == 0, shown.err
    assert "t1: waiting for concurrency key 'user:ann' (1 of 1 held)" in shown.out
    answer = (await awp_async(*target, "run", "get", str(run_id), "--json")).json()
    waiting = {task["key"]: task.get("waitingFor") for task in answer["tasks"]}
    assert waiting == {"t0": None, "t1": "waiting for concurrency key 'user:ann' (1 of 1 held)"}
    # `awp limits list` counts what the key holds back now, in its table and in --json.
    listed = await awp_async(*target, "limits", "list")
    assert listed.code == 0, listed.err
    assert "no rate limits" in listed.out
    assert "CONCURRENCY KEY" in listed.out and "user:ann" in listed.out
    keys = (await awp_async(*target, "limits", "list", "--json")).json()["keysWaiting"]
    assert keys == [{"name": "user:ann", "waiting": "1"}]


async def test_run_start_priority_and_run_get_says_higher_priority_work_is_ahead(
    awp_server: ServerHandle, pool: Pool
) -> None:
    """`awp run start --priority`: the run carries it, out of range is refused naming the
    field, and `awp run get` says a task waits behind higher-priority work."""
    await workflows.create(
        pool,
        validate(
            WorkflowSpec(
                name="ranked",
                version=1,
                tasks=(TaskSpec(key="t", executor_kind="mock", action="noop"),),
            )
        ),
    )
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)
    high = await awp_async(*target, "run", "start", "ranked", "--priority", "5", "--json")
    assert high.code == 0, high.err
    assert high.json()["run"]["priority"] == 5
    # A second high run stays ready behind the first, ahead of the low one.
    assert (await awp_async(*target, "run", "start", "ranked", "--priority", "5")).code == 0
    low = await awp_async(*target, "run", "start", "ranked", "--priority", "-5", "--json")
    low_id = low.json()["run"]["id"]
    refused = await awp_async(*target, "run", "start", "ranked", "--priority", "11")
    assert refused.code != 0 and "priority: must be -10 to 10" in refused.err
    await register(pool, max_concurrency=1)
    assert await dispatch_all(pool) == 1
    shown = await awp_async(*target, "run", "get", low_id)
    assert shown.code == 0, shown.err
    assert "t: waiting behind higher-priority work (priority" in shown.out
