"""Waits that hold no worker slot (docs/design.md §16, docs/sdk.md "Durable execution:
waits"): ``ctx.sleep``, ``ctx.wait_for_signal`` and ``ctx.wait_for_approval``.

A wait is a checkpoint of the task, named as a step is, ``(kind, name, occurrence)`` in
the order the action reaches it. When a previous attempt's wait was satisfied (or timed
out), its outcome is replayed at once. Otherwise the worker asks the server (Await):
when the condition is met already -- a signal sent before the wait, a sleep with no
time left -- the outcome is stored and returned; when it is not, the attempt ends
SUSPENDED: the action is stopped (``WaitSuspended``, an ``ActionCancelled``: let it
propagate), the lease and the slot are free, no attempt is charged, and the task runs
again from the top once the signal or the decision arrives or the time comes,
replaying its steps and the waits already satisfied. A wait that times out raises
``WaitTimedOut`` inside the action, which may catch it.

In a sync action each call returns its value; in an async action it returns an
awaitable: ``await ctx.sleep(60)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from awp_protocol.limits import MAX_PROMPT_CHARS, MAX_WAIT_MS
from awp_protocol.names import CHECKPOINT_NAME_PATTERN, CHECKPOINT_NAME_RULE
from awp_sdk.actions import ActionCancelled, ActionContext
from awp_sdk.replay import Checkpoint, Kind, Replay

# A duration: seconds (int or float) or a timedelta.
Duration = float | int | timedelta


class WaitTimedOut(Exception):
    """A wait ended by its timeout, not its condition (the same on every later attempt:
    the timeout is the wait's stored outcome)."""

    def __init__(self, kind: str, name: str) -> None:
        what = "approval" if kind == "approval" else f"signal {name!r}"
        super().__init__(f"the wait for {what} timed out")
        self.kind = kind
        self.name = name


class WaitSuspended(ActionCancelled):
    """The attempt ended SUSPENDED at a wait: the action stops, nothing is reported, and
    the task runs again once the wait is satisfied. Do not catch it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """An approval's outcome: approved or rejected, by whom, when, and why."""

    approved: bool
    decided_by: str
    comment: str
    decided_at: str  # ISO 8601, the database clock


@dataclass(frozen=True, slots=True)
class WaitSpec:
    """A wait as the worker's store sends it (AwaitRequest)."""

    kind: Kind
    name: str
    occurrence: int
    sleep_ms: int | None = None
    timeout_ms: int | None = None
    prompt: str = ""
    role: str = ""


def duration_ms(what: str, value: Duration | None) -> int | None:
    """A wait's duration in milliseconds (None stays None); ValueError naming ``what``."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{what} must be seconds or a timedelta, got {type(value).__name__}")
    if not math.isfinite(seconds) or not 0 <= seconds * 1000 <= MAX_WAIT_MS:
        raise ValueError(f"{what} must be between 0 and {MAX_WAIT_MS // 1000} seconds")
    return round(seconds * 1000)


def _replay(ctx: ActionContext) -> Replay:
    if ctx.replay is None:
        raise RuntimeError("this ActionContext keeps no checkpoints: only a worker attaches them")
    return ctx.replay


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not CHECKPOINT_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid wait name {name!r}: expected {CHECKPOINT_NAME_RULE}")


async def _outcome(replay: Replay, spec: WaitSpec) -> Checkpoint:
    stored = await replay.lookup(spec.kind, spec.name, spec.occurrence)
    if stored is not None:
        replay.hit(stored)
        return stored
    satisfied = await replay.store.await_wait(spec, replay.savings)
    if satisfied is None:
        raise WaitSuspended(f"suspended at the {spec.kind} wait {spec.name!r}")
    replay.stored(satisfied)
    return satisfied


def _run(ctx: ActionContext, spec: WaitSpec, finish: Any) -> Any:
    replay = _replay(ctx)

    async def wait() -> Any:
        return finish(await _outcome(replay, spec))

    if replay.on_loop():
        return wait()
    return replay.blocking(wait())


def _timed_out(checkpoint: Checkpoint) -> Checkpoint:
    if checkpoint.timed_out:
        raise WaitTimedOut(checkpoint.kind, checkpoint.name)
    return checkpoint


def sleep(ctx: ActionContext, duration: Duration) -> Any:
    """``ctx.sleep``: None once ``duration`` has passed since the wait was first reached
    (database clock), holding no slot meanwhile."""
    sleep_ms = duration_ms("a sleep", duration)
    occurrence = _replay(ctx).occurrence("sleep", "")
    return _run(ctx, WaitSpec("sleep", "", occurrence, sleep_ms=sleep_ms), lambda _: None)


def wait_for_signal(ctx: ActionContext, name: str, timeout: Duration | None = None) -> Any:
    """``ctx.wait_for_signal``: the payload of the next signal ``name`` sent to the run
    (one sent before the wait counts); WaitTimedOut after ``timeout``."""
    _check_name(name)
    timeout_ms = duration_ms("a wait's timeout", timeout)
    occurrence = _replay(ctx).occurrence("signal", name)
    spec = WaitSpec("signal", name, occurrence, timeout_ms=timeout_ms)
    return _run(ctx, spec, lambda checkpoint: _timed_out(checkpoint).value)


def wait_for_approval(
    ctx: ActionContext,
    prompt: str,
    timeout: Duration | None = None,
    role: str | None = None,
    name: str = "approval",
) -> Any:
    """``ctx.wait_for_approval``: the Decision on ``prompt`` (approved or rejected);
    WaitTimedOut after ``timeout``. ``role="admin"`` lets only admins decide (by default
    approvers and admins may)."""
    _check_name(name)
    if not isinstance(prompt, str) or not 0 < len(prompt) <= MAX_PROMPT_CHARS:
        raise ValueError(f"an approval's prompt must be 1 to {MAX_PROMPT_CHARS} characters")
    if role not in (None, "approver", "admin"):
        raise ValueError(f"an approval's role must be 'approver' or 'admin', not {role!r}")
    timeout_ms = duration_ms("a wait's timeout", timeout)
    occurrence = _replay(ctx).occurrence("approval", name)
    spec = WaitSpec(
        "approval", name, occurrence, timeout_ms=timeout_ms, prompt=prompt, role=role or ""
    )

    def decision(checkpoint: Checkpoint) -> Decision:
        value = _timed_out(checkpoint).value
        return Decision(
            approved=bool(value["approved"]),
            decided_by=str(value["decided_by"]),
            comment=str(value["comment"]),
            decided_at=str(value["decided_at"]),
        )

    return _run(ctx, spec, decision)
