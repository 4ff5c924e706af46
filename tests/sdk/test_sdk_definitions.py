"""A workflow in code and its YAML twin are the same definition: the demo's workflow file
and the same workflow written with awp_sdk give equal messages, and the server stores
them as one (the second apply is a no-op)."""

from __future__ import annotations

from awp_cli.dev.command import demo_workflow
from awp_cli.workflow_file import load
from awp_demo import actions
from awp_kernel.definition_proto import spec_from_proto
from awp_sdk import AsyncClient, Retry, Workflow
from kit import ADMIN_TOKEN, ServerHandle


def demo_in_code() -> Workflow:
    wf = Workflow(
        "research-digest",
        version=1,
        concurrency=4,
        description="Fetch four sources in parallel, summarize them, publish the digest.",
    )
    fetches = [
        wf.add(f"fetch_{source}", kind="mock", action="sources.fetch", input=extra, timeout="30s")
        for source, extra in [
            ("news", {"source": "news", "sleep_ms": 700}),
            ("papers", {"source": "papers", "sleep_ms": 1200}),
        ]
    ]
    fetches.append(
        wf.add(
            "fetch_forum",
            kind="mock",
            action="sources.fetch",
            input={"source": "forum", "sleep_ms": 400, "fail_attempts": 1},
            retry=Retry(max_attempts=3, initial_backoff="300ms", max_backoff=2, multiplier=2),
            timeout=30,
        )
    )
    fetches.append(
        wf.add(
            "fetch_changelog",
            kind="mock",
            action="sources.fetch",
            input={"source": "changelog", "sleep_ms": 500},
            timeout="30s",
        )
    )
    summarize = wf.task(
        action="digest.summarize",
        depends_on=fetches,
        input={
            "topic": "durable workflow engines",
            "sources": ["news", "papers", "forum", "changelog"],
            "max_keywords": 6,
        },
        timeout="30s",
    )(actions.summarize)  # the demo's own function, already an @action of that name
    wf.task(
        action="digest.publish",
        depends_on=[summarize],
        input={"channel": "#research"},
        retry=Retry(max_attempts=5, initial_backoff=0.25, max_backoff="5s"),
        timeout="30s",
    )(actions.publish)
    return wf


def test_the_demo_in_code_is_the_demo_file() -> None:
    from_file = load(demo_workflow()).definition
    from_code = demo_in_code().definition()
    assert from_code == from_file
    assert (
        spec_from_proto(from_code).definition_hash() == spec_from_proto(from_file).definition_hash()
    )


async def test_the_server_stores_them_as_one(awp_server: ServerHandle) -> None:
    async with AsyncClient(awp_server.address, token=ADMIN_TOKEN) as client:
        assert (await client.apply(load(demo_workflow()).definition)).created is True
        assert (await client.apply(demo_in_code())).created is False
        assert (await client.apply(demo_in_code().to_dict())).created is False
