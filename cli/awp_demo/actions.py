"""Python actions of the demo workflow (awp_demo/workflow.yaml), written with the worker SDK.

Run them with `awp-worker --kinds python --module awp_demo.actions` from the
repository root (`awp demo` does this for you).

Each action gets its own `input`, the run's input (`ctx.run_input`) and the outputs of
the tasks it depends on (`ctx.upstream`, by task key). The mock fetches only echo which
source they fetched, so the documents themselves are a small built-in corpus: the
example runs anywhere without a network.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

from awp_worker import ActionContext, PermanentError, action

# What the four fetch tasks would have returned from the network.
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


@action("digest.summarize")
def summarize(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """A sync action (run in the worker's thread pool): keywords of the fetched sources."""
    # The sources that upstream fetches actually delivered (mock output echoes its input).
    fetched = [out.get("echo", {}).get("source") for out in ctx.upstream.values()]
    sources = sorted(s for s in fetched if s) or input.get("sources") or sorted(CORPUS)
    unknown = [s for s in sources if s not in CORPUS]
    if unknown:
        # Retrying cannot make an unknown source appear: fail the task at once.
        raise PermanentError(f"no documents for source(s) {', '.join(unknown)}")
    words: Counter[str] = Counter()
    for source in sources:
        # Long sync work should check for cancellation (lease lost, worker draining).
        ctx.raise_if_cancelled()
        words.update(w for w in re.findall(r"[a-z]+", CORPUS[source].lower()) if w not in STOPWORDS)
    keywords = [word for word, _ in words.most_common(int(input.get("max_keywords", 5)))]
    ctx.logger.info("summarized %d sources", len(sources))
    return {
        "topic": input.get("topic", ""),
        "sources": len(sources),
        "keywords": keywords,
        "digest": f"{input.get('topic', 'Digest')}: " + ", ".join(keywords),
    }


@action("digest.publish")
async def publish(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    """An async action with a side effect, made safe for at-least-once delivery.

    A real publish sends `ctx.idempotency_key` (stable across attempts) so the receiver
    drops a repeat, and `ctx.fencing_token` so it refuses a stale attempt's write.
    """
    await asyncio.sleep(0.2)  # the call to the chat or CMS API
    digest = ctx.upstream.get("summarize", {}).get("digest", "")
    return {
        "channel": input.get("channel", "#general"),
        "text": digest,
        "message_id": f"msg-{ctx.idempotency_key.replace('/', '-')}",
        "idempotency_key": ctx.idempotency_key,
        "fencing_token": ctx.fencing_token,
        "attempt": ctx.attempt,
    }
