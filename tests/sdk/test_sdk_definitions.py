"""A workflow in code and its YAML twin are the same definition: the demo's workflow file
and awp_demo.workflow give equal messages, and the server stores them as one (the second
apply is a no-op). Map, on_failure and always are written as the file writes them, and
checked with the server's own rules."""

from __future__ import annotations

import pytest

from awp_cli.dev.command import demo_workflow
from awp_cli.workflow_file import load
from awp_demo.workflow import wf as demo
from awp_kernel.definition_proto import spec_from_proto
from awp_sdk import AsyncClient, DefinitionInvalid, Map, Workflow
from awp_sdk.actions import ActionRegistry
from kit import ADMIN_TOKEN, ServerHandle


def test_the_demo_in_code_is_the_demo_file() -> None:
    from_file = load(demo_workflow()).definition
    from_code = demo.definition()
    assert from_code == from_file
    assert (
        spec_from_proto(from_code).definition_hash() == spec_from_proto(from_file).definition_hash()
    )


async def test_the_server_stores_them_as_one(awp_server: ServerHandle) -> None:
    async with AsyncClient(awp_server.address, token=ADMIN_TOKEN) as client:
        assert (await client.apply(load(demo_workflow()).definition)).created is True
        assert (await client.apply(demo)).created is False
        assert (await client.apply(demo.to_dict())).created is False


def test_map_on_failure_and_always_are_the_files_fields() -> None:
    wf = Workflow("sdk-dynamic", version=1)
    plan = wf.add("plan", kind="mock", action="sdk.plan")
    # The task mapped over is a dependency without being listed.
    search = wf.add("search", kind="mock", action="sdk.search", map=Map(plan, "echo.queries"))
    wf.add("audit", kind="mock", action="sdk.audit", depends_on=[plan], on_failure="continue")
    wf.add("cleanup", kind="mock", action="sdk.cleanup", depends_on=[search], always=True)
    tasks = wf.to_dict()["tasks"]
    assert tasks[1] == {
        "key": "search",
        "kind": "mock",
        "action": "sdk.search",
        "depends_on": ["plan"],
        "map": {"over": "plan", "path": "echo.queries"},
    }
    assert (tasks[2]["on_failure"], tasks[3]["always"]) == ("continue", True)
    assert "on_failure" not in tasks[0] and "always" not in tasks[0]
    definition = wf.definition()
    assert (definition.tasks[1].map.over, definition.tasks[3].always) == ("plan", True)


def test_a_map_over_a_task_of_another_workflow_is_refused() -> None:
    other = Workflow("sdk-other", version=1).add("plan", kind="mock", action="sdk.plan")
    wf = Workflow("sdk-dynamic", version=1)
    with pytest.raises(ValueError, match="of another workflow"):
        wf.add("search", kind="mock", action="sdk.search", map=Map(other, "queries"))


def test_the_rules_that_relate_tasks_are_the_servers() -> None:
    wf = Workflow("sdk-dynamic", version=1)
    plan = wf.add("plan", kind="mock", action="sdk.plan")
    wf.add("search", kind="mock", action="sdk.search", map=Map(plan, "a b"), always=True)
    with pytest.raises(DefinitionInvalid) as refused:
        wf.definition()
    assert {v.field for v in refused.value.violations} == {
        "definition.tasks[1].map",
        "definition.tasks[1].map.path",
    }


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"retries": 5}, r"unknown option 'retries' \(did you mean 'retry'\?\)"),
        ({"timout": "5s"}, r"unknown option 'timout' \(did you mean 'timeout'\?\)"),
        ({"depends": []}, r"unknown option 'depends' \(did you mean 'depends_on'\?\)"),
        ({"labels": {"team": "a"}}, r"unknown option 'labels'; the options are always, "),
    ],
)
def test_an_unknown_option_is_refused_by_name(given: dict[str, object], message: str) -> None:
    """Neither the decorator nor add() lets an option vanish from the definition."""
    registry = ActionRegistry()
    wf = Workflow("sdk-options", version=1, registry=registry)
    with pytest.raises(TypeError, match=f"task 'fetch': {message}"):
        wf.add("fetch", kind="mock", action="sdk.fetch", **given)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=f"task 'fetch': {message}"):

        @wf.task(**given)  # type: ignore[call-overload]
        def fetch(ctx: object, input: dict[str, object]) -> dict[str, object]:
            return {}

    # Nothing was declared, nor registered under the action's name.
    assert (wf.tasks, registry.names()) == ((), [])
