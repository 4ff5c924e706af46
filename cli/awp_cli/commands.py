"""The commands that talk to a running awp-server: workflows, runs, workers, stats.

Each takes the connected Client and the parsed arguments and returns the exit code;
failures raise CliError. With `--json` a command prints the response's protobuf JSON
mapping (what grpcurl prints) instead of tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import struct_pb2
from google.protobuf.message import Message
from rich.live import Live
from rich.markup import escape
from rich.progress import Progress
from rich.text import Text

from awp.v1 import control_pb2, types_pb2
from awp_cli import event_view, render, workflow_file
from awp_cli.client import Client
from awp_cli.errors import CliError, Exit
from awp_cli.follow import ProgressView, follow, run_exit
from awp_cli.render import run_state, task_state
from awp_protocol.limits import MAX_PAGE_SIZE as MAX_PAGE  # the server's largest page
from awp_protocol.states import TERMINAL_RUN_STATES

M = TypeVar("M", bound=Message)


async def _all_pages(
    client: Client,
    method: Callable[..., Awaitable[M]],
    request: Any,
    items: str,
    limit: int,
) -> M:
    """Follows page tokens until `limit` items; the answer holds them all (and the token of
    what is left, so --json output can be resumed by a script)."""
    combined: M | None = None
    while True:
        have = 0 if combined is None else len(getattr(combined, items))
        request.page_size = min(limit - have, MAX_PAGE)
        answer = await client.call(method, request)
        if combined is None:
            combined = answer
        else:
            getattr(combined, items).extend(getattr(answer, items))
            combined.next_page_token = answer.next_page_token  # type: ignore[attr-defined]
        token: str = answer.next_page_token  # type: ignore[attr-defined]
        if not token or len(getattr(combined, items)) >= limit:
            return combined
        request.page_token = token


# ---------------------------------------------------------------- workflows


async def workflow_apply(client: Client, args: argparse.Namespace) -> Exit:
    if workflow_file.is_code_reference(args.file):
        definition = workflow_file.from_code(args.file)
        loaded = None
    else:
        loaded = workflow_file.load(Path(args.file))
        definition = loaded.definition
    try:
        answer = await client.call(
            client.control.CreateWorkflow,
            control_pb2.CreateWorkflowRequest(definition=definition),
        )
    except CliError as error:
        if error.code != Exit.USAGE or loaded is None:
            raise
        # The server names fields (definition.tasks[2].depends_on[0]); say where they are.
        raise CliError(
            error.code,
            f"{args.file}: {error.message}",
            loaded.explain(error.violations) + error.details,
        ) from None
    if args.json:
        render.print_json(answer)
        return Exit.OK
    d = answer.workflow.definition
    ref = render.workflow_ref(d.name, d.version)
    if answer.created:
        render.stdout.print(f"created workflow [bold]{ref}[/] ({len(d.tasks)} tasks)")
    else:
        render.stdout.print(f"workflow [bold]{ref}[/] is unchanged (already stored)")
    return Exit.OK


async def workflow_list(client: Client, args: argparse.Namespace) -> Exit:
    answer = await _all_pages(
        client,
        client.control.ListWorkflows,
        control_pb2.ListWorkflowsRequest(name=args.name or ""),
        "workflows",
        args.limit,
    )
    if args.json:
        render.print_json(answer)
    elif not answer.workflows:
        render.stdout.print("no workflows yet: create one with `awp workflow apply FILE`")
    else:
        render.stdout.print(render.workflows_table(answer.workflows))
    return Exit.OK


async def workflow_get(client: Client, args: argparse.Namespace) -> Exit:
    name, version = args.workflow
    answer = await client.call(
        client.control.GetWorkflow, control_pb2.GetWorkflowRequest(name=name, version=version)
    )
    if args.json:
        # The Workflow alone, not its response wrapper: a file `awp workflow apply` takes.
        render.print_json(answer.workflow)
    else:
        render.stdout.print(render.workflow_view(answer.workflow))
    return Exit.OK


# ---------------------------------------------------------------- runs


async def run_start(client: Client, args: argparse.Namespace) -> Exit:
    name, version = args.workflow
    request = control_pb2.StartRunRequest(
        workflow_name=name, workflow_version=version, request_id=args.request_id or ""
    )
    if args.input is not None:
        request.input.CopyFrom(args.input)
    if args.start_in is not None:
        request.start_delay.FromMilliseconds(round(args.start_in * 1000))
    answer = await client.call(client.control.StartRun, request)
    run = answer.run
    if not args.wait:
        if args.json:
            render.print_json(answer)
        else:
            _print_started(answer)
        return Exit.OK
    if not args.json:
        _print_started(answer)
    final = await wait_for_run(client, run, quiet=args.json)
    return run_exit(final.run)


def _print_started(answer: control_pb2.StartRunResponse) -> None:
    run = answer.run
    ref = render.workflow_ref(run.workflow_name, run.workflow_version)
    if answer.created:
        render.stdout.print(f"started run [bold]{run.id}[/] of {ref}")
    else:
        render.stdout.print(
            f"run [bold]{run.id}[/] of {ref} was already started with request id "
            f"{escape(repr(run.request_id))} (state {run_state(run.state)})"
        )


async def wait_for_run(
    client: Client, run: control_pb2.Run, *, quiet: bool = False
) -> control_pb2.GetRunResponse:
    """Follows the run with a live display (plain lines when not on a terminal), then
    prints its summary; with quiet, prints only the final GetRun answer as JSON."""
    if quiet:
        final = await follow(client, run.id)
        render.print_json(final)
        return final
    view = ProgressView(run)
    try:
        if render.stdout.is_terminal:
            with Live(view, console=render.stdout, refresh_per_second=8, transient=True):
                final = await follow(
                    client,
                    run.id,
                    on_event=view.on_event,
                    on_snapshot=view.on_snapshot,
                    on_reconnect=view.on_reconnect,
                )
        else:
            final = await follow(
                client, run.id, on_event=_print_progress_event, on_reconnect=_print_note
            )
    except asyncio.CancelledError:
        render.stderr.print(
            Text(f"stopped watching; run {run.id} goes on (awp run watch {run.id})", style="yellow")
        )
        raise
    render.stdout.print(render.run_summary(final))
    return final


def _print_progress_event(event: types_pb2.StateEvent) -> None:
    if event.type in event_view.PROGRESS_EVENTS:
        render.stdout.print(event_view.event_line(event))


def _print_note(note: str) -> None:
    render.stderr.print(Text(note, style="yellow"))


async def run_get(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(client.control.GetRun, control_pb2.GetRunRequest(run_id=args.run_id))
    if args.json:
        render.print_json(answer)
    else:
        render.stdout.print(render.run_view(answer))
    return Exit.OK


async def run_tasks(client: Client, args: argparse.Namespace) -> Exit:
    """Every task of a run, map elements included, page by page (GetRun lists 10,000)."""
    request = control_pb2.ListTasksRequest(run_id=args.run_id)
    # --json prints one answer holding every page; tables go out page by page.
    answer = control_pb2.ListTasksResponse()
    while True:
        page = await client.call(client.control.ListTasks, request)
        answer.tasks.extend(page.tasks)
        answer.tracebacks_omitted += page.tracebacks_omitted
        if not args.json:
            render.stdout.print(render.task_list(page.tasks))
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    if args.json:
        render.print_json(answer)
    return Exit.OK


async def run_output(client: Client, args: argparse.Namespace) -> Exit:
    """The whole output, however large (GetRun leaves large ones out)."""
    request = control_pb2.GetTaskOutputRequest(run_id=args.run_id, task_key=args.task_key)
    answer = await client.call(client.control.GetTaskOutput, request)
    if not answer.output_json:
        raise CliError(
            Exit.RUN_NOT_SUCCEEDED, f"task {args.task_key} of run {args.run_id} has no output (yet)"
        )
    sys.stdout.write(answer.output_json + "\n")
    return Exit.OK


async def run_retry(client: Client, args: argparse.Namespace) -> Exit:
    request = control_pb2.RetryRunRequest(
        run_id=args.run_id, from_task=args.from_task or "", request_id=args.request_id or ""
    )
    answer = await client.call(client.control.RetryRun, request)
    if args.json and not args.wait:
        render.print_json(answer)
        return Exit.OK
    if not args.json:
        _print_retried(answer)
    if not args.wait:
        return Exit.OK
    final = await wait_for_run(client, answer.run, quiet=args.json)
    return run_exit(final.run)


def _print_retried(answer: control_pb2.RetryRunResponse) -> None:
    run = answer.run
    if not answer.created:
        render.stdout.print(
            f"run [bold]{run.id}[/] was already started with request id "
            f"{escape(repr(run.request_id))} (state {run_state(run.state)})"
        )
        return
    # Right after creation, the run's only succeeded tasks are the reused ones.
    counts = render.task_counts(run)
    reused = counts.get("succeeded", 0)
    rerun = sum(counts.values()) - reused
    start = f" from task {escape(run.retry_from_task)}" if run.retry_from_task else ""
    render.stdout.print(
        f"started run [bold]{run.id}[/], a retry of run {run.retried_from_run_id}{start}: "
        f"{reused} task{'s' * (reused != 1)} reused, {rerun} to run"
    )


async def logs(client: Client, args: argparse.Namespace) -> Exit:
    request = control_pb2.ListAttemptsRequest(run_id=args.run_id, task_key=args.task or "")
    # --json prints one answer holding every page; tables go out page by page.
    answer = control_pb2.ListAttemptsResponse()
    while True:
        page = await client.call(client.control.ListAttempts, request)
        answer.attempts.extend(page.attempts)
        if not args.json:
            for attempt in page.attempts:
                render.stdout.print(render.attempt_log(attempt))
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    if args.json:
        render.print_json(answer)
    elif not answer.attempts:
        render.stdout.print(await _why_no_attempts(client, args.run_id, args.task))
    return Exit.OK


async def _why_no_attempts(client: Client, run_id: str, task_key: str | None) -> str:
    if task_key is None:
        return f"run {run_id} has no attempts yet"
    found = await client.call(client.control.GetRun, control_pb2.GetRunRequest(run_id=run_id))
    task = next((t for t in found.tasks if t.key == task_key), None)
    if task is None:  # ListAttempts already refused an unknown task
        return f"run {run_id} has no task {task_key!r}"
    if task.reused_from_run_id:
        return (
            f"task {task_key} did not run in run {run_id}: it reused the output of run "
            f"{task.reused_from_run_id} (awp logs {task.reused_from_run_id} {task_key})"
        )
    return f"task {task_key} has no attempts yet (it is {task_state(task.state)})"


async def run_list(client: Client, args: argparse.Namespace) -> Exit:
    request = control_pb2.ListRunsRequest(workflow_name=args.workflow or "")
    if args.state:
        request.state = types_pb2.RunState.Value(f"RUN_STATE_{args.state.upper()}")
    answer = await _all_pages(client, client.control.ListRuns, request, "runs", args.limit)
    if args.json:
        render.print_json(answer)
    elif not answer.runs:
        render.stdout.print("no runs match")
    else:
        render.stdout.print(render.runs_table(answer.runs))
    return Exit.OK


async def run_watch(client: Client, args: argparse.Namespace) -> Exit:
    def show(event: types_pb2.StateEvent) -> None:
        if args.json:
            render.print_json(event, one_line=True)
        else:
            render.stdout.print(event_view.event_line(event))

    final = await follow(
        client, args.run_id, on_event=show, on_reconnect=_print_note, after_seq=args.after_seq
    )
    if not args.json:
        render.stdout.print(render.run_summary(final))
    return run_exit(final.run)


async def run_cancel(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.CancelRun,
        control_pb2.CancelRunRequest(run_id=args.run_id, reason=args.reason or ""),
    )
    run = answer.run
    state = run_state(run.state)
    if args.wait:
        final = await follow(client, run.id)
        run = final.run
        state = run_state(run.state)
    if args.json:
        render.print_json(answer if not args.wait else control_pb2.CancelRunResponse(run=run))
    elif state in TERMINAL_RUN_STATES:
        render.stdout.print(f"run [bold]{run.id}[/] is {state}")
    else:
        render.stdout.print(
            f"cancel requested for run [bold]{run.id}[/]; the coordinator converges it "
            f"(awp run watch {run.id})"
        )
    return Exit.OK


async def run_prune(client: Client, args: argparse.Namespace) -> Exit:
    """PruneRuns called until nothing qualifies (or, dry, every page is counted), one
    bounded call at a time, showing progress; then what it deleted (or would)."""
    request = control_pb2.PruneRunsRequest(dry_run=args.dry_run)
    request.older_than.FromTimedelta(timedelta(seconds=args.older_than))
    total = control_pb2.PruneRunsResponse()
    progress = Progress(console=render.stderr, transient=True)
    step = progress.add_task("counting" if args.dry_run else "deleting", total=None)
    with progress if render.stderr.is_terminal else contextlib.nullcontext():
        while True:
            answer = await client.call(client.control.PruneRuns, request)
            render.add_pruned(total, answer)
            progress.update(step, completed=total.runs, total=total.runs + answer.remaining)
            if not render.stderr.is_terminal and not args.json:
                render.stderr.print(render.prune_progress(total, args.dry_run))
            if args.dry_run and answer.next_page_token:
                request.page_token = answer.next_page_token
            elif args.dry_run or answer.runs == 0 or answer.remaining == 0:
                break
    if args.json:
        render.print_json(total)
    else:
        render.stdout.print(render.prune_summary(total, args.dry_run))
    return Exit.OK


# ---------------------------------------------------------------- fleet


async def workers(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(
        client.control.ListWorkers, control_pb2.ListWorkersRequest(include_inactive=args.all)
    )
    if args.json:
        render.print_json(answer)
    elif not answer.workers:
        hint = "" if args.all else " (--all also lists stopped and offline ones)"
        render.stdout.print(f"no workers{hint}")
    else:
        render.stdout.print(render.workers_table(answer.workers))
    return Exit.OK


async def stats(client: Client, args: argparse.Namespace) -> Exit:
    answer = await client.call(client.control.GetStats, control_pb2.GetStatsRequest())
    if args.json:
        render.print_json(answer)
    else:
        render.stdout.print(render.stats_view(answer))
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


def json_object(text: str) -> struct_pb2.Struct:
    """A JSON object given inline, or read from a file as @FILE."""
    source = "the value"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {source}: {exc.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{source} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{source} must be a JSON object, like '{{\"k\": 1}}'")
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct
