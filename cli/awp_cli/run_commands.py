"""The commands about runs: start, get, tasks, output, list, watch, retry, cancel, prune
and `awp logs`. Each takes the SDK's AsyncClient and the parsed arguments and returns the
exit code, as awp_cli.commands' do."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from datetime import timedelta

from rich.live import Live
from rich.markup import escape
from rich.progress import Progress
from rich.text import Text

from awp_cli import event_view, render
from awp_cli.commands import first_items
from awp_cli.errors import CliError, Exit
from awp_cli.follow import ProgressView, follow, run_exit
from awp_cli.render_fleet import add_pruned, prune_progress, prune_summary
from awp_cli.render_runs import run_summary, run_view, runs_table, task_counts
from awp_cli.render_tasks import attempt_log, task_list
from awp_common import tracing
from awp_protocol.jsonvalue import canonical_json
from awp_sdk import wire
from awp_sdk.client import AsyncClient
from awp_sdk.records import Attempt, Event, Pruned, Run, RunDetail, TaskStatus
from awp_sdk.resumes import asked_for_decision


async def run_start(client: AsyncClient, args: argparse.Namespace) -> Exit:
    name, version = args.workflow
    start_in = None if args.start_in is None else timedelta(seconds=args.start_in)
    handle = await client.start(
        name,
        input=args.input,
        request_id=args.request_id,
        version=version,
        start_in=start_in,
        priority=args.priority,
    )
    run = handle.started
    assert run is not None  # StartRun answers with the run
    if not args.wait:
        if args.json:
            render.print_json(wire.started(run, handle.created))
        else:
            _print_started(run, handle.created)
        return Exit.OK
    if not args.json:
        _print_started(run, handle.created)
    final = await wait_for_run(client, run, quiet=args.json)
    return run_exit(final.run)


def _print_started(run: Run, created: bool) -> None:
    ref = render.workflow_ref(run.workflow, run.version)
    if created:
        render.stdout.print(f"started run [bold]{run.id}[/] of {ref}")
    else:
        render.stdout.print(
            f"run [bold]{run.id}[/] of {ref} was already started with request id "
            f"{escape(repr(run.request_id))} (state {run.state})"
        )


async def wait_for_run(client: AsyncClient, run: Run, *, quiet: bool = False) -> RunDetail:
    """Follows the run with a live display (plain lines when not on a terminal), then
    prints its summary; with quiet, prints only the final GetRun answer as JSON."""
    if quiet:
        final = await follow(client, run.id)
        render.print_json(wire.run_detail(final))
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
    render.stdout.print(run_summary(final))
    return final


def _print_progress_event(event: Event) -> None:
    if event.type in event_view.PROGRESS_EVENTS:
        render.stdout.print(event_view.event_line(event))


def _print_note(note: str) -> None:
    render.stderr.print(Text(note, style="yellow"))


async def run_get(client: AsyncClient, args: argparse.Namespace) -> Exit:
    # One GetRun: the view shows no large output (`awp run output` prints one).
    detail = await client.get_run(args.run_id, outputs=False)
    if args.json:
        render.print_json(wire.run_detail(detail))
        return Exit.OK
    # The decisions on approvals are in the run's events, read only when a task asked.
    asked = any(asked_for_decision(task) for task in detail.tasks.values())
    decided = await client.decisions(args.run_id) if asked else []
    render.stdout.print(run_view(detail, decided, _trace_url()))
    return Exit.OK


def _trace_url() -> str | None:
    """The tracing UI's URL template (AWP_TRACE_URL), checked; None when unset."""
    template = os.environ.get(tracing.TRACE_URL_VARIABLE) or None
    if template is None:
        return None
    try:
        return tracing.trace_url_template(template)
    except ValueError as exc:
        raise CliError(Exit.USAGE, str(exc)) from None


async def run_tasks(client: AsyncClient, args: argparse.Namespace) -> Exit:
    """Every task of a run, map elements included, page by page (GetRun lists 10,000)."""
    # --json prints one answer holding every page; tables go out page by page.
    tasks: list[TaskStatus] = []
    tracebacks_omitted = 0
    token = ""
    while True:
        page = await client.list_tasks_page(args.run_id, page_token=token)
        tasks.extend(page.items)
        tracebacks_omitted += page.tracebacks_omitted
        if not args.json:
            render.stdout.print(task_list(page.items))
        token = page.next_page_token
        if not token:
            break
    if args.json:
        render.print_json(wire.tasks(tasks, tracebacks_omitted=tracebacks_omitted))
    return Exit.OK


async def run_output(client: AsyncClient, args: argparse.Namespace) -> Exit:
    """The whole output, however large (GetRun leaves large ones out)."""
    output = await client.get_task_output(args.run_id, args.task_key)
    if output is None:
        raise CliError(
            Exit.RUN_NOT_SUCCEEDED, f"task {args.task_key} of run {args.run_id} has no output (yet)"
        )
    # The server's own text of it (canonical JSON).
    sys.stdout.write(canonical_json(output).decode() + "\n")
    return Exit.OK


async def run_retry(client: AsyncClient, args: argparse.Namespace) -> Exit:
    handle = await client.retry(args.run_id, from_task=args.from_task, request_id=args.request_id)
    run = handle.started
    assert run is not None  # RetryRun answers with the new run
    if args.json and not args.wait:
        render.print_json(wire.started(run, handle.created))
        return Exit.OK
    if not args.json:
        _print_retried(run, handle.created)
    if not args.wait:
        return Exit.OK
    final = await wait_for_run(client, run, quiet=args.json)
    return run_exit(final.run)


def _print_retried(run: Run, created: bool) -> None:
    if not created:
        render.stdout.print(
            f"run [bold]{run.id}[/] was already started with request id "
            f"{escape(repr(run.request_id))} (state {run.state})"
        )
        return
    # Right after creation, the run's only succeeded tasks are the reused ones.
    counts = task_counts(run)
    reused = counts.get("succeeded", 0)
    rerun = sum(counts.values()) - reused
    start = f" from task {escape(run.retry_from_task)}" if run.retry_from_task else ""
    render.stdout.print(
        f"started run [bold]{run.id}[/], a retry of run {run.retried_from_run_id}{start}: "
        f"{reused} task{'s' * (reused != 1)} reused, {rerun} to run"
    )


async def logs(client: AsyncClient, args: argparse.Namespace) -> Exit:
    # --json prints one answer holding every page; tables go out page by page.
    attempts: list[Attempt] = []
    token = ""
    while True:
        page = await client.list_attempts_page(args.run_id, task_key=args.task, page_token=token)
        attempts.extend(page.items)
        if not args.json:
            for attempt in page.items:
                render.stdout.print(attempt_log(attempt))
        token = page.next_page_token
        if not token:
            break
    if args.json:
        render.print_json(wire.attempts(attempts))
    elif not attempts:
        render.stdout.print(await _why_no_attempts(client, args.run_id, args.task))
    return Exit.OK


async def _why_no_attempts(client: AsyncClient, run_id: str, task_key: str | None) -> str:
    if task_key is None:
        return f"run {run_id} has no attempts yet"
    task = (await client.get_run(run_id, outputs=False)).tasks.get(task_key)
    if task is None:  # ListAttempts already refused an unknown task
        return f"run {run_id} has no task {task_key!r}"
    if task.reused_from_run_id:
        return (
            f"task {task_key} did not run in run {run_id}: it reused the output of run "
            f"{task.reused_from_run_id} (awp logs {task.reused_from_run_id} {task_key})"
        )
    return f"task {task_key} has no attempts yet (it is {task.state})"


async def run_list(client: AsyncClient, args: argparse.Namespace) -> Exit:
    found, token = await first_items(
        lambda token, size: client.list_runs_page(
            workflow=args.workflow, state=args.state, page_size=size, page_token=token
        ),
        args.limit,
    )
    if args.json:
        render.print_json(wire.runs(found, token))
    elif not found:
        render.stdout.print("no runs match")
    else:
        render.stdout.print(runs_table(found))
    return Exit.OK


async def run_watch(client: AsyncClient, args: argparse.Namespace) -> Exit:
    def show(event: Event) -> None:
        if args.json:
            render.print_json(wire.event(event), one_line=True)
        else:
            render.stdout.print(event_view.event_line(event))

    final = await follow(
        client, args.run_id, on_event=show, on_reconnect=_print_note, after_seq=args.after_seq
    )
    if not args.json:
        render.stdout.print(run_summary(final))
    return run_exit(final.run)


async def run_cancel(client: AsyncClient, args: argparse.Namespace) -> Exit:
    run = await client.cancel(args.run_id, args.reason)
    if args.wait:
        run = (await follow(client, run.id)).run
    if args.json:
        render.print_json(wire.run(run))
    elif run.done:
        render.stdout.print(f"run [bold]{run.id}[/] is {run.state}")
    else:
        render.stdout.print(
            f"cancel requested for run [bold]{run.id}[/]; the coordinator converges it "
            f"(awp run watch {run.id})"
        )
    return Exit.OK


async def run_prune(client: AsyncClient, args: argparse.Namespace) -> Exit:
    """PruneRuns called until nothing qualifies (or, dry, every page is counted), one
    bounded call at a time, showing progress; then what it deleted (or would)."""
    older_than = timedelta(seconds=args.older_than)
    total = Pruned(0, 0, 0, 0, 0, 0, None, "")
    token = ""
    progress = Progress(console=render.stderr, transient=True)
    step = progress.add_task("counting" if args.dry_run else "deleting", total=None)
    with progress if render.stderr.is_terminal else contextlib.nullcontext():
        while True:
            answer = await client.prune_runs(older_than, dry_run=args.dry_run, page_token=token)
            total = add_pruned(total, answer)
            progress.update(step, completed=total.runs, total=total.runs + answer.remaining)
            if not render.stderr.is_terminal and not args.json:
                render.stderr.print(prune_progress(total, args.dry_run))
            if args.dry_run and answer.next_page_token:
                token = answer.next_page_token
            elif args.dry_run or answer.runs == 0 or answer.remaining == 0:
                break
    if args.json:
        render.print_json(wire.pruned(total))
    else:
        render.stdout.print(prune_summary(total, args.dry_run))
    return Exit.OK
