"""How the CLI shows a run's events: one short line per state change."""

from __future__ import annotations

from typing import Final

from rich.text import Text

from awp.v1 import types_pb2
from awp_cli.render import attempt_state, run_state, styled, task_state
from awp_common.durations import format_duration
from awp_protocol.jsonvalue import struct_to_dict
from awp_sdk.decode import when

# The events that show a run's progress; attempt detail is left to `awp run watch`.
PROGRESS_EVENTS: Final = frozenset(
    {
        types_pb2.EVENT_TYPE_RUN_STATE,
        types_pb2.EVENT_TYPE_TASK_STATE,
        types_pb2.EVENT_TYPE_RUN_CANCEL_REQUESTED,
    }
)
_TRANSITION_NAMES: Final = {
    "run_transition": run_state,
    "task_transition": task_state,
    "attempt_transition": attempt_state,
}


def _transition(event: types_pb2.StateEvent) -> tuple[str, str]:
    """(from, to) state names: from is '' when the subject was just created."""
    which = event.WhichOneof("transition")
    if which is None:
        return "", ""
    change = getattr(event, which)
    name = _TRANSITION_NAMES[which]
    return (name(change.from_state) if change.from_state else ""), name(change.to_state)


def event_line(event: types_pb2.StateEvent) -> Text:
    """One state change as a short line: time, seq, what moved, and why when known."""
    stamp = when(event.created_at)
    clock = stamp.astimezone().strftime("%H:%M:%S.%f")[:-3] if stamp else "--:--:--.---"
    subject = event.task_key or "run"
    if event.attempt:
        subject += f" #{event.attempt}"
    text = Text.assemble((f"{clock} {event.seq:>4}  ", "dim"), f"{subject:<20} ")
    payload = struct_to_dict(event.payload) if event.HasField("payload") else {}
    if event.type == types_pb2.EVENT_TYPE_ATTEMPT_STATE:
        text.append("attempt ", style="dim")
    if event.type == types_pb2.EVENT_TYPE_RUN_CREATED:
        text.append(f"created ({payload.get('workflow', '?')}@{payload.get('version', '?')})")
    elif event.type == types_pb2.EVENT_TYPE_RUN_CANCEL_REQUESTED:
        reason = payload.get("reason")
        text.append("cancel requested" + (f": {reason}" if reason else ""), style="yellow")
    else:
        before, after = _transition(event)
        if before:
            text.append(styled(before))
            text.append(" -> ", style="dim")
        text.append(styled(after))
    if by := payload.get("by"):
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
