"""Nothing is silently lost between the API and the SDK's user: outputs far over
GetRun's inline limit come back whole from result() and outputs(), a record read without
them says so instead of answering short, and RunFailed carries the failed attempt's log
tail, which GetRun leaves off its rows."""

from __future__ import annotations

import asyncio

import pytest
import sdk_flows
from sdk_stack import Stack

from awp_protocol.jsonvalue import json_size
from awp_sdk import Client, OutputsOmitted, RunFailed
from kit import ADMIN_TOKEN


async def test_a_900_kib_output_comes_back_whole(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.large)
        run = await client.start(sdk_flows.large)
        outputs = await run.result(timeout=60)
        expected_text = "ab" * (sdk_flows.LARGE_CHARS // 2)
        assert set(outputs) == {"document", "report", "small"}
        assert outputs["document"] == {"text": expected_text, "n": 1}
        assert json_size(outputs["document"]) > 900 * 1024
        assert len(outputs["report"]["pages"]) == 800
        assert outputs["small"] == {"length": sdk_flows.LARGE_CHARS}

        # GetRun left both large outputs out: the one-call record flags them and refuses
        # to answer outputs() short.
        bare = await client.get_run(run.id, outputs=False)
        assert {k for k, t in bare.tasks.items() if t.output_omitted} == {"document", "report"}
        assert bare.tasks["document"].output is None
        with pytest.raises(OutputsOmitted) as short:
            bare.outputs()
        assert short.value.task_keys == ("document", "report")
        assert "'document', 'report'" in str(short.value)

        whole = await client.get_run(run.id)
        assert whole.outputs() == outputs
        assert not any(t.output_omitted for t in whole.tasks.values())
        assert await client.get_task_output(run.id, "document") == outputs["document"]

    # The same through the sync client, from a thread of its own.
    def read() -> dict[str, dict[str, object]]:
        with Client(stack.address, token=ADMIN_TOKEN) as sync:
            return sync.run(run.id).result(timeout=60)

    assert await asyncio.to_thread(read) == outputs


async def test_run_failed_carries_the_log_tail(stack: Stack) -> None:
    async with stack.client() as client:
        await client.apply(sdk_flows.noisy)
        run = await client.start(sdk_flows.noisy, input={"customer": "c-17"})
        with pytest.raises(RunFailed) as failed:
            await run.result(timeout=60)
    error = failed.value
    assert (error.task_key, error.error) == ("chatty", "quota exceeded")
    assert error.log_tail is not None
    lines = error.log_tail.splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["loading customer c-17", "quota left: 0"]
    assert error.traceback is not None and "PermanentError" in error.traceback
