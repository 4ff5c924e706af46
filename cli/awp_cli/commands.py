"""The commands that talk to a running awp-server about workflows and the fleet, and the
argument types every command shares; the run commands are in run_commands.

Each takes the SDK's AsyncClient and the parsed arguments and returns the exit code; the
SDK's errors propagate to awp_cli.errors.exit_error. With `--json` a command prints the
answer's protobuf JSON mapping (what grpcurl prints, awp_sdk.wire) instead of tables.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from awp_cli import render, workflow_file
from awp_cli.errors import USER_ERRORS, CliError, Exit, exit_error
from awp_cli.render_fleet import stats_view, workers_table
from awp_cli.render_workflows import workflow_view, workflows_table
from awp_protocol.limits import MAX_PAGE_SIZE as MAX_PAGE  # the server's largest page
from awp_sdk import wire
from awp_sdk.client import AsyncClient
from awp_sdk.records import Page

T = TypeVar("T")

# One page of a List call: (page_token, page_size) -> the page.
PageCall = Callable[[str, int], Awaitable[Page[T]]]


async def first_items(page: PageCall[T], limit: int) -> tuple[list[T], str]:
    """Follows page tokens until `limit` items: those, and the token of what is left (so
    --json output can be resumed by a script)."""
    items: list[T] = []
    token = ""
    while True:
        answer = await page(token, min(limit - len(items), MAX_PAGE))
        items.extend(answer.items)
        token = answer.next_page_token
        if not token or len(items) >= limit:
            return items, token


# ---------------------------------------------------------------- workflows


async def workflow_apply(client: AsyncClient, args: argparse.Namespace) -> Exit:
    if workflow_file.is_code_reference(args.file):
        definition = workflow_file.from_code(args.file)
        loaded = None
    else:
        loaded = workflow_file.load(Path(args.file))
        definition = loaded.definition
    try:
        answer = await client.apply(definition)
    except USER_ERRORS as failure:
        if loaded is None:
            raise
        # The server names fields (definition.tasks[2].depends_on[0]); say where they are.
        error = exit_error(failure)
        raise CliError(
            error.code,
            f"{args.file}: {error.message}",
            loaded.explain(error.violations) + error.details,
        ) from None
    if args.json:
        render.print_json(wire.applied(answer))
        return Exit.OK
    ref = render.workflow_ref(answer.name, answer.version)
    if answer.created:
        tasks = len(answer.workflow.tasks) if answer.workflow else 0
        render.stdout.print(f"created workflow [bold]{ref}[/] ({tasks} tasks)")
    else:
        render.stdout.print(f"workflow [bold]{ref}[/] is unchanged (already stored)")
    return Exit.OK


async def workflow_list(client: AsyncClient, args: argparse.Namespace) -> Exit:
    found, token = await first_items(
        lambda token, size: client.list_workflows_page(
            name=args.name, page_size=size, page_token=token
        ),
        args.limit,
    )
    if args.json:
        render.print_json(wire.workflows(found, token))
    elif not found:
        render.stdout.print("no workflows yet: create one with `awp workflow apply FILE`")
    else:
        render.stdout.print(workflows_table(found))
    return Exit.OK


async def workflow_get(client: AsyncClient, args: argparse.Namespace) -> Exit:
    name, version = args.workflow
    stored = await client.get_workflow(name, version)
    if args.json:
        # The Workflow alone, not its response wrapper: a file `awp workflow apply` takes.
        render.print_json(wire.workflow(stored))
    else:
        render.stdout.print(workflow_view(stored))
    return Exit.OK


# ---------------------------------------------------------------- fleet


async def workers(client: AsyncClient, args: argparse.Namespace) -> Exit:
    found = await client.list_workers(include_inactive=args.all)
    if args.json:
        render.print_json(wire.workers(found))
    elif not found:
        hint = "" if args.all else " (--all also lists stopped and offline ones)"
        render.stdout.print(f"no workers{hint}")
    else:
        render.stdout.print(workers_table(found))
    return Exit.OK


async def stats(client: AsyncClient, args: argparse.Namespace) -> Exit:
    answer = await client.get_stats()
    if args.json:
        render.print_json(wire.stats(answer))
    else:
        render.stdout.print(stats_view(answer))
    return Exit.OK


# ---------------------------------------------------------------- argument types


def workflow_ref(text: str) -> tuple[str, int]:
    """NAME or NAME@VERSION (version 0 asks for the latest)."""
    name, sep, version = text.rpartition("@")
    if not sep:
        return text, 0
    if not name or not version.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME or NAME@VERSION, got {text!r}")
    return name, int(version)


def json_value(text: str) -> Any:
    """Any JSON value given inline, or read from a file as @FILE."""
    value, _ = _read_json(text)
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given inline, or read from a file as @FILE."""
    value, source = _read_json(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{source} must be a JSON object, like '{{\"k\": 1}}'")
    return value


def _read_json(text: str) -> tuple[Any, str]:
    source = "the value"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {source}: {exc.strerror}") from None
    try:
        return json.loads(text), source
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{source} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
