"""The python actions of the tracing scenarios (test_traces.py), loaded by their workers
with --module: one traces its own work, as a user's HTTP or model client would, so the
test can see that span nest under the attempt's; one checkpoints steps and waits."""

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


def draft(topic: str) -> dict[str, Any]:
    return {"draft": topic}


@action("traced.agent")
def agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """A durable agent (a sync action: its steps run in the worker's thread): a step that
    reports its cost, a short sleep ended by the coordinator's timer, a wait for a signal,
    then a last step; each wait suspends the attempt, and the next one replays the rest."""
    drafted = ctx.step("draft", draft, "traces", usage={"tokens": 120, "cost_usd": 0.01})
    ctx.sleep(0.2)
    payload = ctx.wait_for_signal("go")
    decision = ctx.wait_for_approval("publish the draft?")
    return ctx.step("final", lambda: {**drafted, "signal": payload, "ok": decision.approved})
