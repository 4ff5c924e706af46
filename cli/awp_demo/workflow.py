"""The example workflow `awp demo` runs, written in code: an agent-shaped research digest.

    plan ──> search (once per query, in parallel) ──> summarize (flaky) ──> publish
                                                                   cleanup (always, last)

`plan` turns the topic into queries; `search` is a map task: one element per query, each
with its own attempts, lease and fencing token; `summarize` gets their outputs in order
and fails its first attempt the way a rate-limited model endpoint does, so attempt 2
runs after a short backoff; `publish` sends the digest under the run's idempotency key;
`cleanup` runs once the rest has ended, succeeded or not.

Try it on `awp dev --module awp_demo.workflow`:

    awp workflow apply awp_demo.workflow:wf
    awp run start research-digest --wait

The search results come from a small built-in corpus, so the example runs anywhere
without a network. `workflow.yaml` beside this file is the same workflow as a file (a
test keeps the two identical).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

from awp_sdk import ActionContext, Map, PermanentError, Retry, RetryableError, Workflow

# What a search engine would have returned, by source.
CORPUS = {
    "news": "Durable workflow engines keep state in PostgreSQL so a crashed worker "
    "loses no task; leases and heartbeats let another worker retry it.",
    "papers": "Fencing tokens order the holders of a lease: a storage system that has "
    "seen token N rejects writes carrying less, so a stale worker cannot "
    "overwrite a newer attempt.",
    "forum": "Users ask for retries with backoff, idempotency keys for side effects, "
    "and a way to watch a run's tasks as they move between states.",
    "changelog": "This release batches claims and completes per transaction, drains "
    "workers on deploy and hands unfinished leases back for an immediate retry.",
}
# fmt: off
STOPWORDS = frozenset({
    "a", "an", "and", "as", "by", "can", "for", "from", "in", "is", "it", "its", "keep",
    "less", "let", "no", "of", "on", "or", "per", "so", "than", "that", "the", "their",
    "this", "to", "what", "who", "with",
})
# fmt: on

wf = Workflow(
    "research-digest",
    version=2,
    # At most four tasks of one run queued or running at once: the four searches.
    concurrency=4,
    description="Plan queries, search each in parallel, summarize, publish, clean up.",
)


@wf.task(input={"topic": "durable workflow engines", "sources": sorted(CORPUS)}, timeout="30s")
def plan(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """One query per source: the list `search` maps over."""
    topic = ctx.run_input.get("topic") or input["topic"]
    return {
        "topic": topic,
        "queries": [{"source": source, "text": topic} for source in input["sources"]],
    }


@wf.task(map=Map(over=plan, path="queries"), retry=3, timeout="30s")
async def search(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """One element of the map: `input["item"]` is its query, `input["index"]` its place."""
    query = input["item"]
    if query["source"] not in CORPUS:
        # Retrying cannot make an unknown source appear: fail the element at once.
        raise PermanentError(f"no documents for source {query['source']!r}")
    await asyncio.sleep(0.2 + 0.1 * input["index"])  # the call to the search API
    return {"source": query["source"], "text": CORPUS[query["source"]]}


@wf.task(
    depends_on=[search],
    input={"max_keywords": 6},
    retry=Retry(max_attempts=3, initial_backoff="300ms", max_backoff="2s"),
    timeout="30s",
)
def summarize(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """A sync action (run in the worker's thread pool) with a flaky first attempt."""
    if ctx.attempt == 1:
        raise RetryableError("the model endpoint answered 429 Too Many Requests")
    results = ctx.upstream["search"]["outputs"]  # the elements' outputs, in query order
    words: Counter[str] = Counter()
    for result in results:
        # Long sync work should check for cancellation (lease lost, worker draining).
        ctx.raise_if_cancelled()
        text = result["text"].lower()
        words.update(w for w in re.findall(r"[a-z]+", text) if w not in STOPWORDS)
    keywords = [word for word, _ in words.most_common(int(input["max_keywords"]))]
    ctx.logger.info("summarized %d search results", len(results))
    return {
        "sources": len(results),
        "keywords": keywords,
        "digest": "Digest: " + ", ".join(keywords),
    }


@wf.task(
    depends_on=[summarize],
    input={"channel": "#research"},
    retry=Retry(max_attempts=5, initial_backoff="250ms", max_backoff="5s"),
    timeout="30s",
)
async def publish(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """An async action with a side effect, made safe for at-least-once delivery.

    A real publish sends `ctx.idempotency_key` (stable across attempts) so the receiver
    drops a repeat, and `ctx.fencing_token` so it refuses a stale attempt's write.
    """
    await asyncio.sleep(0.2)  # the call to the chat or CMS API
    return {
        "channel": input["channel"],
        "text": ctx.upstream["summarize"]["digest"],
        "message_id": f"msg-{ctx.idempotency_key.replace('/', '-')}",
        "idempotency_key": ctx.idempotency_key,
        "fencing_token": ctx.fencing_token,
    }


@wf.task(depends_on=[publish], always=True, timeout="30s")
def cleanup(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """Runs last whatever happened before it: releases what the run held."""
    return {"published": ctx.upstream_states["publish"] == "succeeded", "released": True}
