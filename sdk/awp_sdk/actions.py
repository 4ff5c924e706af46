"""Actions: the functions a Python worker runs for tasks, the context each attempt is
handed, and the errors that say whether a failure may be retried.

``@action("name")`` registers a function in the process-wide registry; ``awp-worker
--module M`` imports M and runs what it registered (``Workflow.task`` registers its
functions the same way). The worker runtime (awp_worker) reads the registry; this module
knows nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from google.protobuf import struct_pb2

from awp_protocol.jsonvalue import json_size, struct_to_dict, to_struct
from awp_protocol.limits import MAX_OUTPUT_BYTES, MAX_STREAM_CHUNK_CHARS
from awp_protocol.names import ACTION_PATTERN, ACTION_RULE

if TYPE_CHECKING:
    from awp_sdk.replay import Replay

ActionFunc = Callable[["ActionContext", dict[str, Any]], Any]
F = TypeVar("F", bound=Callable[..., Any])

# Its lines carry run_id, task_key, attempt and worker_id: the worker's log setup adds them
# to every record. The name is the one it had in the worker (log queries select on it).
_action_logger = logging.getLogger("awp_worker.action")


class RetryableError(Exception):
    """The attempt failed but another attempt may succeed (the task's retry rule applies)."""


class PermanentError(Exception):
    """The attempt failed and retrying cannot help: the task fails without further attempts."""


class ActionCancelled(asyncio.CancelledError):
    """Raised by ``ActionContext.raise_if_cancelled()`` once the worker gave the lease up.

    It derives from ``asyncio.CancelledError`` (a ``BaseException``), so a broad
    ``except Exception`` in user code does not swallow it. Nothing is reported for a
    cancelled attempt: the server decides what happens to the task.
    """


class OutputStream(Protocol):
    """The attempt's output stream (``ctx.stream``): chunks readers see live and can
    resume (``RunHandle.stream``, ``awp run stream``). A chunk is a ``str`` (text) or
    any other JSON value. The worker batches chunks and stores them under the attempt's
    lease: once the lease is lost, writing raises ``ActionCancelled`` and nothing more is
    stored. When the database is slow, a write waits (the buffer is bounded); nothing
    is dropped. Everything written is stored before the attempt's result is reported.
    """

    def write(self, chunk: Any) -> None:
        """Sync actions (they run in a thread): blocks while the buffer is full."""

    async def awrite(self, chunk: Any) -> None:
        """Async actions: waits while the buffer is full."""

    def pipe(self, chunks: Iterable[Any]) -> int:
        """Writes every chunk of an iterator (a model client's tokens); returns how many."""

    async def apipe(self, chunks: AsyncIterable[Any]) -> int:
        """Writes every chunk of an async iterator; returns how many."""


def stream_chunk(chunk: Any) -> tuple[str, bool]:
    """A chunk as it is stored: (text, is_json). A str is text; anything else must be a
    JSON value; either at most MAX_STREAM_CHUNK_CHARS characters (ValueError otherwise)."""
    if isinstance(chunk, str):
        text, is_json = chunk, False
    else:
        try:
            text, is_json = json.dumps(chunk, allow_nan=False, ensure_ascii=False), True
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a stream chunk must be a str or a JSON value: {exc}") from None
    if len(text) > MAX_STREAM_CHUNK_CHARS:
        raise ValueError(
            f"a stream chunk is {len(text)} characters, more than the "
            f"{MAX_STREAM_CHUNK_CHARS} allowed: write it in pieces"
        )
    return text, is_json


class _Unattached:
    """The stream of a context no worker made (a test's): writing says so."""

    def _refuse(self) -> None:
        raise RuntimeError("this ActionContext has no output stream: only a worker attaches one")

    def write(self, chunk: Any) -> None:
        self._refuse()

    async def awrite(self, chunk: Any) -> None:
        self._refuse()

    def pipe(self, chunks: Iterable[Any]) -> int:
        self._refuse()
        return 0

    async def apipe(self, chunks: AsyncIterable[Any]) -> int:
        self._refuse()
        return 0


class OutputError(PermanentError):
    """What an action returned cannot be reported (not a JSON object, too large...)."""


def output_struct(output: object) -> struct_pb2.Struct:
    """Check an action's return value and convert it; raises OutputError. The worker
    reports what this gives, and awp_sdk.testing hands it back to a test."""
    if not isinstance(output, dict):
        raise OutputError(
            f"the action returned {type(output).__name__}, expected a JSON object (dict)"
        )
    try:
        # Keys become strings exactly as JSON would have them.
        plain = json.loads(json.dumps(output, allow_nan=False, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise OutputError(f"the action's output is not valid JSON: {exc}") from None
    try:
        # Integers beyond what a Struct carries exactly are refused, not rounded.
        struct = to_struct(plain, "output")
        # Read back and measured exactly as the server reads it. What it would refuse
        # (NUL characters) fails this attempt, not a Complete carrying other results.
        size = json_size(struct_to_dict(struct))
    except (TypeError, ValueError, AttributeError) as exc:
        raise OutputError(f"the action's output cannot be reported: {exc}") from None
    if size > MAX_OUTPUT_BYTES:
        raise OutputError(
            f"the action's output is {size} bytes of JSON, more than the {MAX_OUTPUT_BYTES} allowed"
        )
    return struct


@dataclass(frozen=True, eq=False)
class ActionContext:
    """What an action knows about the attempt it runs.

    ``idempotency_key`` (``"<run_id>/<task_key>"``) is stable across attempts: use it to
    make side effects idempotent. ``fencing_token`` strictly increases across all leases:
    a downstream store that has seen token N can reject writes carrying less.
    ``deadline`` is a ``time.monotonic()`` instant: the worker cancels the action at the
    latest then (earlier if the lease is revoked or cannot be renewed).
    """

    run_id: str
    task_key: str
    action: str
    attempt: int
    max_attempts: int
    idempotency_key: str
    fencing_token: int
    deadline: float
    worker_id: str = ""
    # The run's input, and the outputs of the tasks this one depends on (by task key).
    run_input: dict[str, Any] = field(default_factory=dict)
    upstream: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The states of the tasks this one depends on ("succeeded", or for an `always` task
    # any final state: "failed", "skipped", "canceled"), by task key.
    upstream_states: dict[str, str] = field(default_factory=dict)
    # The attempt's output stream (OutputStream above).
    stream: OutputStream = field(default_factory=_Unattached, repr=False)
    # The attempt's replay core (awp_sdk.replay): the task's checkpoints, which ctx.step
    # and the waits use. None in a context no worker made.
    replay: Replay | None = field(default=None, repr=False)
    _cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    # What report_usage and slow_down recorded, sent with the attempt's result.
    _usage: dict[str, int] = field(default_factory=dict, repr=False)
    _slowed: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def reported_usage(self) -> dict[str, int]:
        """What report_usage recorded, by limit (a copy)."""
        return dict(self._usage)

    @property
    def slowed_down(self) -> dict[str, float]:
        """What slow_down recorded: seconds by limit (a copy)."""
        return dict(self._slowed)

    def report_usage(self, limit: str, units: int) -> None:
        """What this attempt really used of its task's rate limit ``limit`` (e.g. the
        tokens a model call consumed): sent with the result, it replaces the estimate
        charged when the task was granted. The last report per limit counts."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ValueError(f"usage of {limit!r} must be a whole number >= 0, got {units!r}")
        self._usage[limit] = units

    def slow_down(self, limit: str, retry_after: float) -> None:
        """A provider asked to slow down (e.g. HTTP 429 with retry-after, in seconds): once
        the result is reported, ``limit`` grants nothing to anyone for that long."""
        if not 0 < retry_after <= 3600:
            raise ValueError(
                f"retry_after must be more than 0 and at most 3600 s, got {retry_after}"
            )
        self._slowed[limit] = max(retry_after, self._slowed.get(limit, 0.0))

    @property
    def cancelled(self) -> bool:
        """True once the worker no longer owns the lease (revoked, expired, shutdown)."""
        return self._cancel_event.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``ActionCancelled`` if the lease is gone; call it often in long sync loops."""
        if self._cancel_event.is_set():
            raise ActionCancelled(f"attempt {self.attempt} of {self.idempotency_key} was cancelled")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block (sync actions only) until cancelled or ``timeout`` seconds pass."""
        return self._cancel_event.wait(timeout)

    def time_remaining(self) -> float:
        """Seconds until ``deadline``, never negative."""
        return max(0.0, self.deadline - time.monotonic())

    @property
    def logger(self) -> logging.Logger:
        """A logger whose lines carry run_id, task_key, attempt and worker_id."""
        return _action_logger

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        usage: Mapping[str, Any] | Callable[[Any], Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Runs ``fn(*args, **kwargs)`` once per task across attempts, as the step
        ``name`` (awp_sdk.steps): its JSON result is memoised under the lease, and a
        later attempt gets it back without running ``fn``. ``usage`` is what the step
        cost (``{"tokens": 1234, "cost_usd": 0.02}``, or a function of its result giving
        that), reported as saved whenever a later attempt replays the memo. In an async
        action, ``await ctx.step(...)``. A step that raises is not memoised."""
        from awp_sdk.steps import run_step  # noqa: PLC0415 (steps builds on this module)

        return run_step(self, name, fn, args, kwargs, usage)

    # Waits (awp_sdk.waits, docs/sdk.md "Durable execution: waits"): each holds no slot
    # while its condition is not met; in an async action, await them.
    def sleep(self, duration: float | timedelta) -> Any:
        """Returns once ``duration`` (seconds or a timedelta) has passed on the database
        clock since the sleep was first reached; the attempt suspends meanwhile."""
        from awp_sdk import waits  # noqa: PLC0415 (waits builds on this module)

        return waits.sleep(self, duration)

    def wait_for_signal(self, name: str, timeout: float | timedelta | None = None) -> Any:
        """The payload of the next signal ``name`` sent to the run (one sent earlier
        counts); ``WaitTimedOut`` after ``timeout``."""
        from awp_sdk import waits  # noqa: PLC0415

        return waits.wait_for_signal(self, name, timeout)

    def wait_for_approval(
        self,
        prompt: str,
        timeout: float | timedelta | None = None,
        role: str | None = None,
        name: str = "approval",
    ) -> Any:
        """The ``Decision`` on ``prompt`` (approved or not, by whom, when, the comment);
        ``WaitTimedOut`` after ``timeout``; ``role="admin"``: only admins decide."""
        from awp_sdk import waits  # noqa: PLC0415

        return waits.wait_for_approval(self, prompt, timeout, role, name)

    def _cancel(self) -> None:
        self._cancel_event.set()


_current: contextvars.ContextVar[ActionContext] = contextvars.ContextVar("awp_action_context")


def current_context() -> ActionContext:
    """The context of the action running in this task or thread (the decorator form of
    steps finds it so); RuntimeError outside an action."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("no action is running here: call a step inside an action") from None


@contextlib.contextmanager
def running(ctx: ActionContext) -> Iterator[None]:
    """Makes ``ctx`` the current context while an executor runs its action."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)


@dataclass(frozen=True)
class RegisteredAction:
    name: str
    fn: ActionFunc
    is_async: bool


class ActionRegistry:
    """Maps action names to user functions. ``action`` below uses the process-wide one."""

    def __init__(self) -> None:
        self._actions: dict[str, RegisteredAction] = {}

    def register(self, name: str, fn: ActionFunc) -> None:
        # The same rule the server applies to TaskDefinition.action.
        if not isinstance(name, str) or not ACTION_PATTERN.fullmatch(name):
            raise ValueError(f"invalid action name {name!r}: expected {ACTION_RULE}")
        if not callable(fn):
            raise TypeError(f"action {name!r} must be callable, got {type(fn).__name__}")
        existing = self._actions.get(name)
        if existing is not None and _identity(existing.fn) != _identity(fn):
            raise ValueError(
                f"action {name!r} is already registered by {_identity(existing.fn)}; "
                f"cannot register {_identity(fn)} under the same name"
            )
        self._actions[name] = RegisteredAction(name, fn, _is_async(fn))

    def action(self, name: str) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            self.register(name, fn)
            return fn

        return decorate

    def get(self, name: str) -> RegisteredAction | None:
        return self._actions.get(name)

    def names(self) -> list[str]:
        return sorted(self._actions)

    def __len__(self) -> int:
        return len(self._actions)


DEFAULT_REGISTRY = ActionRegistry()


def action(name: str, *, registry: ActionRegistry | None = None) -> Callable[[F], F]:
    """Register the decorated function as the action ``name``.

    The function takes ``(ctx: ActionContext, input: dict)`` and returns a JSON object
    (a ``dict``); it may be ``async``. Registering a second function under a name
    already taken raises ``ValueError``.
    """
    return (registry if registry is not None else DEFAULT_REGISTRY).action(name)


def _identity(fn: Callable[..., Any]) -> str:
    """Where a function was defined: the same after its module is imported again."""
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    code = getattr(fn, "__code__", None)
    line = f":{code.co_firstlineno}" if code is not None else ""
    return f"{module}.{qualname}{line}"


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
