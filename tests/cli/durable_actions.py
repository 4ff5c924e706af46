"""Actions of the command line's durable-execution tests: an agent whose two model calls
are checkpointed steps, and whose first attempt fails after them, so that the second
replays both memos and the run reports what they saved."""

from __future__ import annotations

from typing import Any

from awp_sdk import ActionContext, Retry, RetryableError, Workflow

agent = Workflow("cli-agent", version=1)


def model(prompt: str) -> dict[str, Any]:
    """Stands in for a model call: its answer, and the tokens it cost."""
    return {"text": prompt.upper(), "tokens": 1000 + len(prompt)}


def cost(answer: dict[str, Any]) -> dict[str, Any]:
    return {"tokens": answer["tokens"], "cost_usd": 0.015}


@agent.task(retry=Retry(max_attempts=2, initial_backoff="10ms"), timeout="60s")
def write(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    outline = ctx.step("outline", model, "outline the notes", usage=cost)
    draft = ctx.step("draft", model, outline["text"], usage=cost)
    if ctx.attempt == 1:
        raise RetryableError("the publishing service is down (the steps are kept)")
    return {"draft": draft["text"]}
