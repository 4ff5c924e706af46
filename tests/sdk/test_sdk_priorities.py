"""docs/workflows.md's "Priorities" example, executed: its YAML applied through the SDK
to a real server, coordinator and worker; a run started at priority 3 has its tasks
granted at 3 + their own priority, the refusal the page prints is the server's words,
and the code spelling gives the same definition."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from sdk_stack import Stack

from awp_db.connect import Pool
from awp_sdk import DefinitionInvalid, InvalidArgument, Workflow, definitions
from kit.invariants import check_committed

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
YAML_BLOCK = re.compile(r"```yaml\n(# priorities\.yaml.*?)```", re.DOTALL)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def example() -> dict[str, Any]:
    match = YAML_BLOCK.search(PAGE.read_text())
    assert match is not None, "the priorities.yaml block is missing from docs/workflows.md"
    loaded: dict[str, Any] = yaml.safe_load(match[1])
    return loaded


def page_shows(message: str) -> bool:
    flat = " ".join(message.split())
    plain = [text for lang, text in BLOCK.findall(PAGE.read_text()) if not lang]
    return any(flat in " ".join(text.split()) for text in plain)


async def test_the_pages_example_grants_at_the_run_s_plus_the_task_s(
    stack: Stack, pool: Pool
) -> None:
    async with stack.client() as client:
        await client.apply(example())
        handle = await client.start("support-triage", priority=3)
        assert handle.started is not None and handle.started.priority == 3
        await handle.result(timeout=60)
        with pytest.raises(InvalidArgument) as refused:
            await client.start("support-triage", priority=11)
        (violation,) = refused.value.violations
        assert page_shows(f"INVALID_ARGUMENT {violation.field}: {violation.description}")
        stored = await client.get_workflow("support-triage")
    assert {task.key: task.priority for task in stored.tasks} == {"triage": 5, "bulk": 0}
    granted = await pool.fetch(
        """SELECT t.key, d.priority FROM dispatches d JOIN tasks t ON t.id = d.task_id
            WHERE d.run_id = $1""",
        UUID(handle.id),
    )
    assert {row["key"]: row["priority"] for row in granted} == {"triage": 8, "bulk": 3}
    await check_committed(pool)


def test_the_code_spelling_gives_the_same_definition() -> None:
    wf = Workflow("support-triage", version=1)
    wf.add("triage", action="echo", kind="mock", priority=5)
    wf.add("bulk", action="echo", kind="mock")
    assert wf.definition() == definitions.definition(example())


def test_a_priority_out_of_range_is_refused_before_sending() -> None:
    bad = example()
    bad["tasks"][0]["priority"] = 11
    with pytest.raises(DefinitionInvalid, match=r"tasks\[0\]\.priority: must be -10 to 10"):
        definitions.definition(bad)
