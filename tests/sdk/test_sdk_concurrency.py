"""docs/workflows.md's "Concurrency keys" example, executed: its YAML applied through the
SDK to a real server, coordinator and worker; ten runs over two users finish with never
more than two of a user's running at once (judged over the attempt history by the
invariant checker too), and the two refusals the page prints are the server's words."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sdk_stack import Stack

from awp_db.connect import Pool
from awp_sdk import (
    ActionContext,
    Concurrency,
    DefinitionInvalid,
    InvalidArgument,
    Rate,
    Workflow,
    action,
    definitions,
)
from awp_sdk.limits import RateLimits
from kit.invariants import check_committed

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
YAML_BLOCK = re.compile(r"```yaml\n(# keyed\.yaml.*?)```", re.DOTALL)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


@action("support.answer")
async def answer(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    # Stands in for the model call: long enough for the keys to be what bounds the work;
    # it "used" half its max_tokens.
    await asyncio.sleep(0.1)
    ctx.report_usage("openai-tpm", ctx.run_input["max_tokens"] // 2)
    return {"user": ctx.run_input["user_id"]}


def example() -> dict[str, Any]:
    match = YAML_BLOCK.search(PAGE.read_text())
    assert match is not None, "the keyed.yaml block is missing from docs/workflows.md"
    loaded: dict[str, Any] = yaml.safe_load(match[1])
    return loaded


def page_shows(message: str) -> bool:
    """The message appears in one of the page's plain blocks (line breaks as spaces)."""
    flat = " ".join(message.split())
    plain = [text for lang, text in BLOCK.findall(PAGE.read_text()) if not lang]
    return any(flat in " ".join(text.split()) for text in plain)


async def test_the_pages_example_runs_within_its_keys(stack: Stack, pool: Pool) -> None:
    async with stack.client() as client:
        await RateLimits(client).set("openai-tpm", 90_000, per=timedelta(minutes=1))
        await client.apply(example())
        users = ["ann"] * 8 + ["bob"] * 2
        handles = [
            await client.start("support-answer", input={"user_id": user, "max_tokens": 4_000})
            for user in users
        ]
        for handle in handles:
            await handle.result(timeout=120)
        used = (await RateLimits(client).get("openai-tpm")).used
    print(f"openai-tpm used: {used}")
    # Each call reported 2,000 of the 4,000 charged at grant: the reports replaced them.
    assert used == 10 * 2_000
    await check_committed(pool)
    peak = await pool.fetch(
        """WITH spans AS (
               SELECT k.key, a.started_at, a.finished_at
                 FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id
                 CROSS JOIN LATERAL unnest(d.concurrency_keys) AS k (key))
           SELECT s.key, max((SELECT count(*) FROM spans o
                               WHERE o.key = s.key AND o.started_at <= s.started_at
                                 AND s.started_at < o.finished_at)) AS peak
             FROM spans s GROUP BY s.key ORDER BY s.key"""
    )
    peaks = {row["key"]: row["peak"] for row in peak}
    print(f"peak running per key: {peaks}")
    assert peaks["user:ann"] == 2 and peaks["user:bob"] <= 2, peaks
    assert peaks["llm"] <= 50
    assert not await pool.fetchval(
        "SELECT count(*) FROM dispatches WHERE state IN ('pending', 'leased')"
    )


async def test_the_refusals_the_page_prints_are_the_servers(stack: Stack) -> None:
    bad = example()
    bad["tasks"][0]["concurrency_limits"][0]["key"] = "user:{input.user id}"
    async with stack.client() as client:
        with pytest.raises(DefinitionInvalid) as refused:
            await client.apply(bad)
        (violation,) = refused.value.violations
        assert page_shows(f"INVALID_DEFINITION {violation.field}: {violation.description}")
        await client.apply(example())
        with pytest.raises(InvalidArgument) as started:
            await client.start("support-answer", input={"user": "ann", "max_tokens": 1})
        (violation,) = started.value.violations
        assert page_shows(f"INVALID_ARGUMENT {violation.field}: {violation.description}")


def test_the_code_spelling_gives_the_same_definition() -> None:
    wf = Workflow("support-answer", version=1)
    wf.add(
        "answer",
        action="support.answer",
        kind="python",
        concurrency=[Concurrency("user:{input.user_id}", max=2), Concurrency("llm", max=50)],
        rate_limits=[Rate("openai-tpm", units="{input.max_tokens}")],
    )
    assert wf.definition() == definitions.definition(example())
