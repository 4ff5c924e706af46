"""AWP worker: the runtime behind ``awp-worker``, and the action SDK re-exported from
``awp_sdk`` (its home; see docs/sdk.md).

Register a function as an action, point ``awp-worker --kinds python --module my_pkg``
at the module, and the worker runs it for every task whose action has that name::

    from awp_sdk import ActionContext, RetryableError, action

    @action("reports.summarize")
    async def summarize(ctx: ActionContext, input: dict) -> dict:
        ...
        return {"summary": text}

Sync functions run in a thread pool (poll ``ctx.cancelled`` or call
``ctx.raise_if_cancelled()`` in long loops); async functions run on the event loop and
are cancelled directly. Raise ``RetryableError`` or ``PermanentError`` to say whether
a failure may succeed when tried again; any other exception counts as retryable.
"""

from __future__ import annotations

from awp_sdk.actions import (
    ActionCancelled,
    ActionContext,
    PermanentError,
    RetryableError,
    action,
)

__all__ = ["ActionCancelled", "ActionContext", "PermanentError", "RetryableError", "action"]
