"""How the CLI shows things, the parts every resource shares: the consoles, JSON for
scripts, states in colour, times and counts. Each resource's views are in their own
module (render_workflows, render_runs, render_tasks, render_fleet; event_view), all
drawn from awp_sdk.records."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from rich.console import Console
from rich.text import Text

from awp_common.durations import format_duration
from awp_sdk.enums import TaskState

# Piped output is not wrapped at 80 columns: a table row stays one line for grep and awk.
_PIPED_WIDTH: Final = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 250
stdout = Console(highlight=False, width=_PIPED_WIDTH)
# Long error lines must stay one line each, whatever the terminal width.
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

# The order a task moves through its states (the SDK's enum, in the protocol's order):
# tables list states this way.
TASK_STATE_ORDER: Final = tuple(state.value for state in TaskState)
STYLES: Final = {
    "succeeded": "green",
    "failed": "bold red",
    "canceled": "yellow",
    "skipped": "dim",
    "pending": "dim",
    "ready": "white",
    "queued": "cyan",
    "running": "bold blue",
    "waiting_retry": "magenta",
    "waiting": "bold yellow",
    "suspended": "yellow",
    "interrupted": "magenta",
    "timed_out": "red",
    "active": "green",
    "draining": "yellow",
    "stopped": "dim",
    "offline": "red",
    "leased": "blue",
}


def print_json(shown: Mapping[str, Any], *, one_line: bool = False) -> None:
    """An answer's protobuf JSON mapping (awp_sdk.wire) as grpcurl prints it."""
    text = json.dumps(shown, indent=None if one_line else 2, ensure_ascii=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- small values


def styled(state: str, text: str | None = None) -> Text:
    # str(): a state is an awp_sdk.enums StrEnum member; Text keeps plain strings.
    return Text(text if text is not None else str(state), style=STYLES.get(state, ""))


def seconds_between(begin: datetime | None, finish: datetime | None) -> float | None:
    if begin is None:
        return None
    return ((finish or datetime.now(UTC)) - begin).total_seconds()


def ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    seconds = max(0.0, (datetime.now(UTC) - moment).total_seconds())
    return f"{format_duration(seconds)} ago" if seconds >= 1 else "just now"


def local_time(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def took(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def counts_text(by_state: Mapping[str, int], order: Sequence[str] = TASK_STATE_ORDER) -> Text:
    """'3 succeeded · 1 running' in state order, coloured, zeros left out."""
    text = Text()
    known = [s for s in order if by_state.get(s)]
    extra = sorted(s for s in by_state if s not in order and by_state[s])
    for state in (*known, *extra):
        if text:
            text.append(" · ", style="dim")
        text.append(f"{by_state[state]} {state}", style=STYLES.get(state, ""))
    return text or Text("no tasks", style="dim")


def workflow_ref(name: str, version: int) -> str:
    return f"{name}@{version}"
