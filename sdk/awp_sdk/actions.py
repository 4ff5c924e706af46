"""Actions: the functions a Python worker runs for tasks, the context each attempt is
handed, and the errors that say whether a failure may be retried.

``@action("name")`` registers a function in the process-wide registry; ``awp-worker
--module M`` imports M and runs what it registered (``Workflow.task`` registers its
functions the same way). The worker runtime (awp_worker) reads the registry; this module
knows nothing of it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import struct_pb2

from awp_protocol.jsonvalue import json_size, struct_to_dict, to_struct
from awp_protocol.limits import MAX_OUTPUT_BYTES
from awp_protocol.names import ACTION_PATTERN, ACTION_RULE

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
    _cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)

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

    def _cancel(self) -> None:
        self._cancel_event.set()


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
