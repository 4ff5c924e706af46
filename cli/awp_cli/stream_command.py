"""`awp run stream RUN TASK [--from N]`: a task's output stream as it is written.

Text chunks go to stdout as they are (a model's tokens read as prose), JSON chunks one per
line; attempt boundaries go to stderr, so `> file` keeps only the output. With --json,
every chunk and boundary is one JSON line on stdout (positions included, to resume with
--from). The SDK resumes across reconnects by itself; on Ctrl-C the position to resume
from is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from rich.text import Text

from awp_cli import render
from awp_cli.errors import Exit
from awp_sdk.client import AsyncClient
from awp_sdk.streams import AttemptBoundary, StreamChunk, StreamItem


async def run_stream(client: AsyncClient, args: argparse.Namespace) -> Exit:
    position = args.from_offset
    last_end: AttemptBoundary | None = None
    try:
        async for item in client.task_stream(
            args.run_id, args.task_key, from_offset=position, on_reconnect=_note
        ):
            _show(item, as_json=args.json)
            if isinstance(item, StreamChunk):
                position = item.position + 1
            elif item.kind == "ended":
                last_end = item
    except asyncio.CancelledError:
        render.stderr.print(
            Text(
                f"stopped; resume with: awp run stream {args.run_id} {args.task_key} "
                f"--from {position}",
                style="yellow",
            )
        )
        raise
    if last_end is not None and last_end.state != "succeeded":
        return Exit.RUN_NOT_SUCCEEDED
    return Exit.OK


def _show(item: StreamItem, *, as_json: bool) -> None:
    if as_json:
        if isinstance(item, StreamChunk):
            kind = "json" if item.is_json else "text"
            line: dict[str, object] = {
                "position": item.position,
                "attempt": item.attempt,
                "offset": item.offset,
            }
            line[kind] = item.data
        else:
            line = {"boundary": item.kind, "attempt": item.attempt, "position": item.position}
            if item.kind == "ended":
                line |= {"state": item.state, "error": item.error_message}
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    elif isinstance(item, StreamChunk):
        sys.stdout.write(json.dumps(item.data) + "\n" if item.is_json else item.data)
    else:
        sys.stdout.flush()
        render.stderr.print(Text(_boundary_line(item), style="dim"))
    sys.stdout.flush()


def _boundary_line(boundary: AttemptBoundary) -> str:
    if boundary.kind == "started":
        return f"-- attempt {boundary.attempt} started (position {boundary.position})"
    error = f": {boundary.error_message}" if boundary.error_message else ""
    return f"-- attempt {boundary.attempt} ended {boundary.state}{error}"


def _note(note: str) -> None:
    render.stderr.print(Text(note, style="yellow"))
