"""How the CLI shows a run's events: one short line per state change."""

from __future__ import annotations

from typing import Final

from rich.text import Text

from awp_cli.render import styled
from awp_common.durations import format_duration
from awp_sdk.enums import EventType
from awp_sdk.records import Event
from awp_sdk.resumes import decision_of

# The events that show a run's progress; attempt detail is left to `awp run watch`.
PROGRESS_EVENTS: Final = frozenset(
    {EventType.RUN_STATE, EventType.TASK_STATE, EventType.RUN_CANCEL_REQUESTED}
)


def event_line(event: Event) -> Text:
    """One state change as a short line: time, seq, what moved, and why when known."""
    stamp = event.created_at
    clock = stamp.astimezone().strftime("%H:%M:%S.%f")[:-3] if stamp else "--:--:--.---"
    subject = event.task_key or "run"
    if event.attempt:
        subject += f" #{event.attempt}"
    text = Text.assemble((f"{clock} {event.seq:>4}  ", "dim"), f"{subject:<20} ")
    payload = event.payload
    if event.type is EventType.ATTEMPT_STATE:
        text.append("attempt ", style="dim")
    if event.type is EventType.RUN_CREATED:
        text.append(f"created ({payload.get('workflow', '?')}@{payload.get('version', '?')})")
    elif event.type is EventType.RUN_CANCEL_REQUESTED:
        reason = payload.get("reason")
        text.append("cancel requested" + (f": {reason}" if reason else ""), style="yellow")
    else:
        if event.from_state is not None:
            text.append(styled(event.from_state))
            text.append(" -> ", style="dim")
        text.append(styled(event.to_state or ""))
    decision = decision_of(event)
    if decision is not None:
        text.append("  approved" if decision.approved else "  rejected", style="bold")
        text.append(f" by {decision.decided_by or '?'}", style="dim")
        if decision.comment:
            text.append(f": {decision.comment!r}", style="dim")
    elif by := payload.get("by"):
        text.append(f"  by {by}", style="dim")
    if retried := payload.get("retried_from"):
        text.append(f"  retry of run {retried}", style="dim")
    if reused := payload.get("reused_from"):
        text.append(f"  reused from run {reused}", style="dim")
    error = payload.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    if error:
        text.append(f"  {error}", style="dim")
    if isinstance(payload.get("retry_in_ms"), int | float):
        text.append(f"  retry in {format_duration(payload['retry_in_ms'] / 1000)}", style="dim")
    return text
