"""The fleet and the store: workers, the system's counts (`awp stats`) and what
`awp run prune` deleted."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from awp_cli.render import ago, local_time, styled
from awp_common.durations import format_duration
from awp_protocol.placement import worker_labels
from awp_sdk.records import Pruned, Stats, Worker


def workers_table(found: Iterable[Worker]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = ("WORKER", "NAME", "STATE", "KINDS", "LEASES", "LABELS", "RESOURCES", "HEARTBEAT")
    for column in (*columns, "REGISTERED"):
        table.add_column(column)
    for worker in found:
        table.add_row(
            worker.id,
            worker.name,
            styled(worker.state),
            ",".join(worker.executor_kinds),
            f"{worker.active_leases}/{worker.max_concurrency}",
            ",".join(worker_labels(worker.labels, worker.models)),
            resources_held(worker),
            ago(worker.last_heartbeat_at),
            local_time(worker.registered_at),
        )
    return table


def resources_held(worker: Worker) -> str:
    """Each resource as "name reserved/capacity", e.g. "gpu 1/2"."""
    return ", ".join(
        f"{name} {worker.reserved.get(name, 0)}/{capacity}"
        for name, capacity in worker.resources.items()
    )


def stats_view(stats: Stats) -> RenderableType:
    table = Table(box=None, header_style="bold")
    for column in ("OF", "STATE", "KIND"):
        table.add_column(column)
    table.add_column("COUNT", justify="right")
    # The server lists each section in its enum's (lifecycle) order.
    sections: list[tuple[str, list[tuple[str, str, int]]]] = [
        ("runs", [(state, "", n) for state, n in stats.runs_by_state.items()]),
        (
            "tasks of running runs",
            [(c.state, c.executor_kind, c.count) for c in stats.tasks_by_state],
        ),
        ("dispatches", [(c.state, c.executor_kind, c.count) for c in stats.dispatches_by_state]),
        ("workers", [(state, "", n) for state, n in stats.workers_by_state.items()]),
    ]
    for section, rows in sections:
        if not rows:
            table.add_row(section, Text("none", style="dim"), "", "0")
        for state, kind, count in rows:
            table.add_row(section, styled(state), kind, str(count))
    oldest = (
        format_duration(stats.oldest_pending.total_seconds())
        if stats.oldest_pending is not None
        else "none pending"
    )
    footer = Text.assemble(
        ("active leases ", "dim"),
        (str(stats.active_leases), "bold"),
        ("   oldest pending dispatch ", "dim"),
        (oldest, "bold"),
    )
    return Group(table, Text(""), footer)


# ---------------------------------------------------------------- retention


def add_pruned(total: Pruned, answer: Pruned) -> Pruned:
    """One PruneRuns answer's counts added to the total; what is left and the cutoff are
    the latest answer's (a total has no next page)."""
    return dataclasses.replace(
        answer,
        runs=total.runs + answer.runs,
        tasks=total.tasks + answer.tasks,
        attempts=total.attempts + answer.attempts,
        dispatches=total.dispatches + answer.dispatches,
        events=total.events + answer.events,
        next_page_token="",
    )


def prune_progress(total: Pruned, dry_run: bool) -> str:
    verb = "counted" if dry_run else "deleted"
    return f"{verb} {total.runs:,} runs so far, {total.remaining:,} to go"


def prune_summary(total: Pruned, dry_run: bool) -> Text:
    rows = (
        f"{total.tasks:,} tasks, {total.attempts:,} attempts, {total.dispatches:,} dispatches, "
        f"{total.events:,} events"
    )
    finished = f"finished before {local_time(total.cutoff)}"
    if dry_run:
        return Text(f"would delete {total.runs:,} runs {finished}, with {rows}")
    text = Text(f"deleted {total.runs:,} runs {finished}, with {rows}")
    if total.remaining:
        # Only runs other transactions held right then are skipped.
        text.append(
            f"\n{total.remaining:,} more were busy (another prune, most likely): run again",
            style="yellow",
        )
    return text
