"""`awp run start-many`: many runs of one workflow from a file of inputs, one JSON object
per line, started through StartRuns (AsyncClient.start_many), up to MAX_START_RUNS runs
per call and transaction."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from awp_cli import render
from awp_cli.errors import Exit, usage
from awp_protocol.limits import MAX_START_RUNS
from awp_sdk.client import AsyncClient
from awp_sdk.starts import RunRequest


def read_inputs(source: str) -> list[dict[str, Any]]:
    """Every line's JSON object (blank lines skipped), or a CliError naming the first bad
    line: nothing is started from a file that is not whole."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise usage(f"cannot read {source}: {exc.strerror}") from None
    inputs: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise usage(f"{source}, line {number}: not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise usage(f"{source}, line {number}: a run's input must be a JSON object")
        inputs.append(value)
    if not inputs:
        raise usage(f"{source} holds no input: one JSON object per line starts one run")
    return inputs


async def run_start_many(client: AsyncClient, args: argparse.Namespace) -> Exit:
    name, version = args.workflow
    inputs = read_inputs(args.inputs)
    started: list[tuple[str, bool]] = []
    prefix = args.request_id_prefix
    for first in range(0, len(inputs), MAX_START_RUNS):
        handles = await client.start_many(
            RunRequest(
                name,
                run_input,
                request_id=f"{prefix}-{first + offset}" if prefix else None,
                version=version,
                priority=args.priority,
            )
            for offset, run_input in enumerate(inputs[first : first + MAX_START_RUNS])
        )
        started.extend((handle.id, handle.created) for handle in handles)
    if args.json:
        render.print_json({"runs": [{"runId": rid, "created": new} for rid, new in started]})
        return Exit.OK
    created = sum(new for _, new in started)
    render.stdout.print(
        f"started {created} runs of {render.workflow_ref(name, version)}"
        + (f" ({len(started) - created} were already started)" if created < len(started) else "")
    )
    return Exit.OK
