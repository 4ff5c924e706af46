"""Workflows in code for the SDK's tests. Importing this module registers their actions
(the in-process test worker, and `awp-worker --module sdk_flows`, run them)."""

from __future__ import annotations

import time
from typing import Any

from awp_sdk import ActionContext, Map, PermanentError, Retry, Workflow

numbers = Workflow("sdk-numbers", version=1, description="integers through the whole stack")


@numbers.task(timeout="30s")
def double(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    values = ctx.run_input["values"]
    return {
        "doubled": [2 * v for v in values],
        "attempt": ctx.attempt,
        "edge": ctx.run_input.get("edge"),
    }


@numbers.task(depends_on=[double])
async def total(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    doubled = ctx.upstream["double"]["doubled"]
    return {"sum": sum(doubled), "types": sorted({type(v).__name__ for v in doubled})}


broken = Workflow("sdk-broken", version=1)


@broken.task(retry=Retry(max_attempts=2, initial_backoff="10ms"))
def lookup(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    table = {"present": 1}
    return {"value": table[ctx.run_input["key"]]}  # KeyError for anything else


@broken.task(depends_on=[lookup])
def after(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {}


final = Workflow("sdk-final", version=1)


@final.task
def refuse(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    raise PermanentError("no such customer")


slow = Workflow("sdk-slow", version=1)


@slow.task(timeout="60s")
def wait(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    # Until the run is canceled (the lease revoked) or the input's time is up.
    deadline = time.monotonic() + float(ctx.run_input.get("seconds", 30))
    while not ctx.wait_cancelled(0.05) and time.monotonic() < deadline:
        pass
    return {"waited": True}


steps = Workflow("sdk-steps", version=1)
first = steps.add("first", kind="mock", action="sdk.sleep", input={"sleep_ms": 50})
second = steps.add("second", kind="mock", action="sdk.sleep", input={"sleep_ms": 50})
third = steps.add(
    "third", kind="mock", action="sdk.sleep", input={"sleep_ms": 50}, depends_on=[first, second]
)


overflow = Workflow("sdk-overflow", version=1)


@overflow.task
def too_big(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"n": 2**53 + 1}


# Retry from failure: `prepare` counts its executions; `publish` fails while BROKEN.
EXECUTIONS: dict[str, int] = {}
BROKEN = {"publish": True}
pipeline = Workflow("sdk-pipeline", version=1)


@pipeline.task
def prepare(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    EXECUTIONS["prepare"] = EXECUTIONS.get("prepare", 0) + 1
    return {"prepared": ctx.run_input["item"]}


@pipeline.task(depends_on=[prepare], retry=1)
def publish(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    if BROKEN["publish"]:
        raise PermanentError("the channel is down")
    return {"published": ctx.upstream["prepare"]["prepared"]}


# Dynamic work in code: a map over a list only known at run time, a branch whose failure
# lets the rest go on, and a cleanup that runs at the end either way.
fanout = Workflow("sdk-fanout", version=1)


@fanout.task
def listing(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"numbers": ctx.run_input["numbers"]}


@fanout.task(map=Map(over=listing, path="numbers"))
def square(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"index": input["index"], "square": input["item"] ** 2}


@fanout.task(depends_on=[square])
def add_up(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"sum": sum(out["square"] for out in ctx.upstream["square"]["outputs"])}


@fanout.task(depends_on=[listing], on_failure="continue", retry=1)
def audit(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    raise PermanentError("the audit log is read-only")


@fanout.task(depends_on=[add_up, audit], always=True)
def cleanup(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"saw": ctx.upstream_states}


# Outputs far over GetRun's 64 KiB inline limit and under the 1 MiB output limit: every
# one must come back whole.
large = Workflow("sdk-large", version=1)
LARGE_CHARS = 900 * 1024


@large.task
def document(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"text": "ab" * (LARGE_CHARS // 2), "n": ctx.attempt}


@large.task
def report(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"pages": [{"page": i, "body": "c" * 1000} for i in range(800)]}


@large.task(depends_on=[document])
def small(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"length": len(ctx.upstream["document"]["text"])}


# A failure that said what it was doing before it failed: its log tail reaches RunFailed.
noisy = Workflow("sdk-noisy", version=1)


@noisy.task(retry=1)
def chatty(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    ctx.logger.warning("loading customer %s", ctx.run_input["customer"])
    ctx.logger.warning("quota left: 0")
    raise PermanentError("quota exceeded")
