"""The python action of the tracing scenario (test_traces.py), loaded by its workers
with --module: it traces its own work, as a user's HTTP or model client would, so the
test can see that span nest under the attempt's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from opentelemetry import trace

from awp_sdk.actions import ActionContext, action

USER_SPAN = "user.model_call"
DONE_LINE = "model call done"

log = logging.getLogger("traced_actions")


@action("traced.work")
async def work(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    with trace.get_tracer("user-code").start_as_current_span(USER_SPAN) as span:
        span.set_attribute("user.task", ctx.task_key)
        await ctx.stream.awrite(f"working on {ctx.task_key}")
        await asyncio.sleep(float(input.get("sleep_ms", 0)) / 1000)
        log.info(DONE_LINE)  # carries the trace and span ids (awp_common.tracing.TraceIds)
    return {"attempt": ctx.attempt}
