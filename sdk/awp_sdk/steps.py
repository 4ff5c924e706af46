"""Step checkpoints (docs/design.md §16, docs/sdk.md "Durable execution: steps"):
``ctx.step(name, fn, *args, **kwargs)`` runs ``fn`` once per task across attempts.

Its result, a JSON value, is stored as a memo keyed by (step, name, occurrence) under
the attempt's lease before ``ctx.step`` returns; a later attempt of the task (after a
crash, a retry, a hand-back, a resume) gets the stored value back without running
``fn``. What ``ctx.step`` returns is the value as stored, read back, on the first run
as on a replay (a tuple reads as a list), so both paths see the same thing. A step that
raises is not memoised: the exception propagates and the task's retry rule applies.

In a sync action (run in a thread) ``ctx.step`` returns the value; in an async action
it returns an awaitable: ``await ctx.step(...)``. ``fn`` may be sync or async either
way (an async ``fn`` of a sync action runs on the worker's loop; a sync ``fn`` of an
async action runs on the loop, so make it quick or async).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from awp_common import tracing
from awp_protocol.jsonvalue import canonical_json, parse_value
from awp_protocol.limits import MAX_MEMO_BYTES
from awp_protocol.names import CHECKPOINT_NAME_PATTERN, CHECKPOINT_NAME_RULE
from awp_sdk.actions import ActionContext, PermanentError, current_context
from awp_sdk.replay import Checkpoint, Replay, Usage

if TYPE_CHECKING:
    from opentelemetry.trace import Span

F = TypeVar("F", bound=Callable[..., Any])
# What a step reports it cost: a mapping ({"tokens": 1234, "cost_usd": 0.02}), or a
# function of the step's result that gives one (the usage a model call returned).
UsageSpec = Mapping[str, Any] | Callable[[Any], Mapping[str, Any]] | None


def run_step(
    ctx: ActionContext,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    usage: UsageSpec,
) -> Any:
    """``ctx.step``: the value (sync actions) or an awaitable of it (async actions)."""
    if not isinstance(name, str) or not CHECKPOINT_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid step name {name!r}: expected {CHECKPOINT_NAME_RULE}")
    if not callable(fn):
        raise TypeError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
    replay = ctx.replay
    if replay is None:
        raise RuntimeError("this ActionContext keeps no checkpoints: only a worker attaches them")
    # A step of an attempt whose lease is gone would be paid for and then refused.
    ctx.raise_if_cancelled()
    # Handed out at the call, in the action's order, not when an awaitable is awaited.
    occurrence = replay.occurrence("step", name)
    if replay.on_loop():
        return _astep(replay, name, occurrence, fn, args, kwargs, usage)
    with _span(name, occurrence) as span:
        stored = replay.blocking(replay.lookup("step", name, occurrence))
        if stored is not None:
            replay.hit(stored)
            return _traced(span, stored, hit=True)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = replay.blocking(result)
        kept = replay.blocking(_record(replay, name, occurrence, result, usage))
        return _traced(span, kept, hit=False)


async def _astep(
    replay: Replay,
    name: str,
    occurrence: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    usage: UsageSpec,
) -> Any:
    with _span(name, occurrence) as span:
        stored = await replay.lookup("step", name, occurrence)
        if stored is not None:
            replay.hit(stored)
            return _traced(span, stored, hit=True)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        kept = await _record(replay, name, occurrence, result, usage)
        return _traced(span, kept, hit=False)


def _span(name: str, occurrence: int) -> contextlib.AbstractContextManager[Span | None]:
    """The step's span, inside the attempt's action span (none for an untraced run)."""
    if not tracing.enabled():
        return contextlib.nullcontext()
    return tracing.child(
        tracing.STEP_SPAN, {tracing.STEP_NAME: name, tracing.STEP_OCCURRENCE: occurrence}
    )


def _traced(span: Span | None, checkpoint: Checkpoint, *, hit: bool) -> Any:
    """The step's value, its span told whether the memo was replayed and what it cost."""
    if span is not None:
        span.set_attribute(tracing.STEP_HIT, hit)
        if checkpoint.usage.tokens:
            span.set_attribute(tracing.STEP_TOKENS, checkpoint.usage.tokens)
        if checkpoint.usage.cost_usd:
            span.set_attribute(tracing.STEP_COST_USD, checkpoint.usage.cost_usd)
    return checkpoint.value


async def _record(
    replay: Replay, name: str, occurrence: int, result: Any, usage: UsageSpec
) -> Checkpoint:
    """Stores the memo; the checkpoint as stored, its value read back."""
    try:
        text = canonical_json(result).decode()
        value = parse_value(text, f"step {name!r}")
    except (TypeError, ValueError) as exc:
        # The same result on every attempt: retrying cannot help.
        raise PermanentError(f"step {name!r} returned a value that is not JSON: {exc}") from None
    size = len(text.encode())
    if size > MAX_MEMO_BYTES:
        raise PermanentError(
            f"step {name!r} returned {size} bytes of JSON, more than the {MAX_MEMO_BYTES} "
            "a memo may hold (the memo size limit)"
        )
    try:
        reported = Usage.of(usage(value) if callable(usage) else (usage or {}))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise PermanentError(f"step {name!r}: {exc}") from None
    stored = await replay.store.record_step(name, occurrence, text, reported)
    if stored is not None:  # another value was stored first: it is the step's result
        replay.stored(stored)
        return stored
    kept = Checkpoint("step", name, occurrence, value, reported)
    replay.stored(kept)
    return kept


def step(name: str | None = None, *, usage: UsageSpec = None) -> Callable[[F], F]:
    """The decorator form of ``ctx.step``: calling the decorated function inside an
    action runs it as the step ``name`` (the function's name by default), memoised::

        @step("summarise", usage=lambda r: {"tokens": r["tokens"]})
        def summarise(text: str) -> dict: ...

        @action("digest")
        def digest(ctx, input):
            return summarise(input["text"])   # once per task, replayed after a crash

    Called in an async action it returns an awaitable, as ``ctx.step`` does.
    """

    def decorate(fn: F) -> F:
        step_name = name if name is not None else fn.__name__
        if not CHECKPOINT_NAME_PATTERN.fullmatch(step_name):
            raise ValueError(f"invalid step name {step_name!r}: expected {CHECKPOINT_NAME_RULE}")

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any | Awaitable[Any]:
            return run_step(current_context(), step_name, fn, args, kwargs, usage)

        return run  # type: ignore[return-value]

    return decorate
