"""Running the awp CLI as a subprocess, as a user would, from the repository root."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
# The packages come from the editable install (`make install`), as for a user.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def awp(*args: str, timeout: float = 60) -> Result:
    done = subprocess.run(
        [sys.executable, "-m", "awp_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=REPOSITORY,
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


async def awp_async(*args: str, env: dict[str, str] | None = None) -> Result:
    """awp() for tests whose server runs on their own event loop: the CLI must not block it."""
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
