"""`awp run start-many` as a user runs it: a file of inputs, one run per line, started
through StartRuns; again with the same request-id prefix starts nothing twice; a bad
line is named and nothing is started."""

from __future__ import annotations

from pathlib import Path

from awp_db import workflows
from awp_db.connect import Pool
from cli.runner import awp_async
from kit import ADMIN_TOKEN, ServerHandle, spec


async def test_start_many_from_a_file(awp_server: ServerHandle, pool: Pool, tmp_path: Path) -> None:
    target = ("--address", awp_server.address, "--token", ADMIN_TOKEN)
    async with pool.acquire() as conn:
        await workflows.create(conn, spec("batch", 2))
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(f'{{"user": "u{i}"}}\n' for i in range(1205)) + "\n")

    first = await awp_async(*target, "run", "start-many", "batch", str(inputs),
                            "--request-id-prefix", "import-7", "--json")  # fmt: skip
    assert first.code == 0, first.err
    runs = first.json()["runs"]
    assert len(runs) == 1205 and all(run["created"] for run in runs)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1205
    assert (
        await pool.fetchval("SELECT input->>'user' FROM runs WHERE request_id = 'import-7-1204'")
        == "u1204"
    )

    again = await awp_async(*target, "run", "start-many", "batch", str(inputs),
                            "--request-id-prefix", "import-7")  # fmt: skip
    assert again.code == 0, again.err
    assert "started 0 runs" in again.out and "1205 were already started" in again.out
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1205

    inputs.write_text('{"user": "a"}\n[1, 2]\n')
    bad = await awp_async(*target, "run", "start-many", "batch", str(inputs))
    assert bad.code == 2 and "line 2" in bad.err and "JSON object" in bad.err
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1205
