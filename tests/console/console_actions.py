"""Python actions of the console's browser tests. A gated task runs until the test opens
its gate (a file named after it in the run input's `gates` directory), so a test decides
when each node of the graph changes; a fragile one fails while its marker file exists."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from awp_worker import ActionContext, PermanentError, RetryableError, action

# How often a gated task looks at its gate: the stand-in for work that takes a while.
GATE_POLL_S = 0.05


@action("console.gate")
async def gate(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    opened = Path(ctx.run_input["gates"]) / ctx.task_key
    # A file has nothing to await; cancelling the run cancels this sleep.
    while not opened.exists():  # noqa: ASYNC110
        await asyncio.sleep(GATE_POLL_S)
    return {"released": ctx.task_key}


@action("console.fetch")
def fetch(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"records": [1, 2, 3]}


@action("console.parse")
def parse(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    records = ctx.upstream["fetch"]["records"]
    ctx.logger.info("parsing %d records", len(records))
    if Path(ctx.run_input["fail_marker"]).exists():
        return read_field({}, "missing")
    return {"parsed": len(records)}


def read_field(record: dict[str, Any], name: str) -> dict[str, Any]:
    if name not in record:
        raise ValueError(f"record has no field {name!r}")
    return {name: record[name]}


@action("console.items")
def items(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"items": input["items"]}


@action("console.element")
async def element(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """A map's element: gated like console.gate, then it fails if its item is negative."""
    opened = Path(ctx.run_input["gates"]) / ctx.task_key
    while not opened.exists():  # noqa: ASYNC110
        await asyncio.sleep(GATE_POLL_S)
    if input["item"] < 0:
        raise ValueError(f"item {input['item']} is negative")
    return {"item": input["item"]}


@action("console.talk")
async def talk(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """Streams a word every GATE_POLL_S until its gate opens, then its last words."""
    opened = Path(ctx.run_input["gates"]) / ctx.task_key
    words = 0
    while not opened.exists():
        await ctx.stream.awrite(f"word{words} ")
        words += 1
        await asyncio.sleep(GATE_POLL_S)
    await ctx.stream.awrite("the end.")
    return {"words": words}


def _model(prompt: str) -> dict[str, Any]:
    """Stands in for a model call: its answer and the tokens it cost."""
    return {"text": prompt.upper(), "tokens": 500}


@action("console.agent")
def agent(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """Two checkpointed model calls; the first attempt fails after them, so the second
    replays both memos."""
    usage = {"tokens": 500, "cost_usd": 0.25}
    outline = ctx.step("outline", _model, "outline", usage=usage)
    draft = ctx.step("draft", _model, outline["text"], usage=usage)
    if ctx.attempt == 1:
        raise RetryableError("publishing is down; the steps are kept")
    return {"draft": draft["text"]}


@action("console.review")
def review(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """A checkpointed draft, then a person's decision on it: the attempt suspends (holding
    no slot) until someone decides, and the next one replays the draft."""
    draft = ctx.step("draft", _model, "the release notes", usage={"tokens": 500})
    decision = ctx.wait_for_approval(f"Publish {draft['text']}?")
    if not decision.approved:
        raise PermanentError(f"rejected by {decision.decided_by}: {decision.comment}")
    return {"published": draft["text"], "approved_by": decision.decided_by}
