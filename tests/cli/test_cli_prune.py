"""`awp runs prune`: a dry run counts and deletes nothing, a prune deletes over several
bounded calls showing progress, only the admin role may, and a bad age is a usage error."""

from __future__ import annotations

from awp_db.connect import Pool
from cli.runner import awp_async
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerHandle, backlog

# More than one PruneRuns call's worth (1,000 by default): progress shows each call.
OLD_RUNS = 2500


async def test_dry_run_then_prune(awp_server: ServerHandle, pool: Pool) -> None:
    made = await backlog.seed(pool, OLD_RUNS, tasks=1, finished_ago_s=8 * 86400)
    await backlog.seed(pool, 2, tasks=1, finished_ago_s=6 * 86400)
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)

    dry = await awp_async(*target, "runs", "prune", "--older-than", "7d", "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith(f"would delete {OLD_RUNS:,} runs finished before ")
    assert dry.err.splitlines() == [
        "counted 1,000 runs so far, 1,500 to go",
        "counted 2,000 runs so far, 500 to go",
        "counted 2,500 runs so far, 0 to go",
    ]
    assert len(await backlog.run_ids(pool)) == OLD_RUNS + 2

    as_json = await awp_async(
        *target, "run", "prune", "--older-than", "168h", "--dry-run", "--json"
    )
    assert as_json.code == 0, as_json.err
    counted = as_json.json()
    rows = sum(int(counted[k]) for k in ("runs", "tasks", "attempts", "dispatches", "events"))
    assert rows == made.rows

    pruned = await awp_async(*target, "runs", "prune", "--older-than", "7d")
    assert pruned.code == 0, pruned.err
    assert pruned.out.startswith(f"deleted {OLD_RUNS:,} runs finished before ")
    assert pruned.err.splitlines() == [
        "deleted 1,000 runs so far, 1,500 to go",
        "deleted 2,000 runs so far, 500 to go",
        "deleted 2,500 runs so far, 0 to go",
    ]
    assert len(await backlog.run_ids(pool)) == 2


async def test_only_the_admin_may_prune_and_the_age_must_be_a_duration(
    awp_server: ServerHandle, pool: Pool
) -> None:
    await backlog.seed(pool, 3, tasks=1)
    address = ("--address", awp_server.address)
    refused = await awp_async(
        *address, "--token", WORKER_TOKEN, "runs", "prune", "--older-than", "1d"
    )
    assert refused.code == 2
    assert refused.err.startswith("awp: PERMISSION_DENIED: ")
    bad = await awp_async(*address, "--token", ADMIN_TOKEN, "runs", "prune", "--older-than", "soon")
    assert bad.code == 2
    assert "--older-than: expected a duration" in bad.err
    assert len(await backlog.run_ids(pool)) == 3
