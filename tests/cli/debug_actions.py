"""Python actions for the end-to-end tests of failures and retries (test_cli_resume): they
record every execution in the file the run's input names, so a test can count them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from awp_worker import ActionContext, action

log = logging.getLogger("debug_actions")


def _executed(ctx: ActionContext) -> None:
    with Path(ctx.run_input["count_file"]).open("a") as file:
        file.write(f"{ctx.task_key} {ctx.run_id}\n")


@action("debug.fetch")
def fetch(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    _executed(ctx)
    return {"records": [1, 2, 3], "run": ctx.run_id}


@action("debug.parse")
def parse(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    _executed(ctx)
    records = ctx.upstream["fetch"]["records"]
    ctx.logger.info("parsing %d records", len(records))
    print("print from parse")
    if Path(ctx.run_input["fail_marker"]).exists():
        record: dict[str, Any] = {}
        return {"value": record["missing"]}
    return {"parsed": len(records), "fetched_in": ctx.upstream["fetch"]["run"]}


@action("debug.publish")
def publish(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    _executed(ctx)
    parsed = ctx.upstream["parse"]
    return {"published": parsed["parsed"], "fetched_in": parsed["fetched_in"]}


@action("debug.noisy")
async def noisy(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """Logs `lines` lines of `width` characters, then fails `depth` calls deep."""
    width = int(ctx.run_input["width"])
    for number in range(int(ctx.run_input["lines"])):
        log.warning("line %03d %s", number, "x" * width)
    return _odd(int(ctx.run_input["depth"]))


# Two functions calling each other: a traceback prints every frame (it folds only the
# same frame repeated).
def _odd(depth: int) -> dict[str, Any]:
    if depth == 0:
        raise ValueError("the bottom of a deep stack")
    return _even(depth - 1)


def _even(depth: int) -> dict[str, Any]:
    return _odd(depth - 1)
