"""Definitions with dynamic work: map tasks, failure policies and always tasks -- their
validation (each message naming its field), their JSON, and the hash of every definition
written before they existed, which must not change."""

from __future__ import annotations

import json
import string

import pytest
from definitions import assert_only, fields_of, spec, task
from hypothesis import given
from hypothesis import strategies as st

from awp_kernel.definition import (
    FAILURE_POLICIES,
    DefinitionInvalid,
    MapSpec,
    TaskSpec,
    WorkflowSpec,
    validate,
)
from awp_kernel.retry import RetryPolicy
from awp_protocol.limits import MAX_MAP_PATH_CHARS
from kit.strategies import JSON_PROPERTY

# --- the hash of definitions without dynamic fields -----------------------------------


def test_definitions_without_dynamic_fields_keep_their_hash() -> None:
    """Digests computed before map, on_failure and always existed: a workflow stored
    then must still be the identical definition (idempotent re-create, no conflict)."""
    chain = WorkflowSpec(
        name="wf",
        version=1,
        tasks=tuple(
            TaskSpec(
                key=f"t{i}",
                executor_kind="mock",
                action="noop",
                depends_on=(f"t{i - 1}",) if i else (),
                retry=RetryPolicy(3, 0, 1000, 2.0),
                timeout_ms=60_000,
            )
            for i in range(3)
        ),
    )
    assert chain.definition_hash().hex() == (
        "feba5d8bf6d4ffceee75e196cf068ef4ba64e0a05bdc4a2671b0dc73a6206bfe"
    )
    assert "map" not in json.dumps(chain.to_json())
    assert "always" not in json.dumps(chain.to_json())


def test_dynamic_fields_are_written_only_when_set_and_change_the_hash() -> None:
    base = spec(task("plan"), task("search", ["plan"]), task("done", ["search"]))
    mapped = spec(
        task("plan"),
        task("search", ["plan"], map=MapSpec("plan", "queries"), on_failure="continue"),
        task("done", ["search"], always=True),
    )
    data = mapped.to_json()
    assert data["tasks"][1]["map"] == {"over": "plan", "path": "queries"}
    assert data["tasks"][1]["on_failure"] == "continue"
    assert data["tasks"][2]["always"] is True
    assert "on_failure" not in data["tasks"][0] and "always" not in data["tasks"][1]
    assert WorkflowSpec.from_json(json.loads(json.dumps(data))) == mapped
    assert len({base.definition_hash(), mapped.definition_hash()}) == 2


# --- validation ------------------------------------------------------------------------


def test_a_valid_definition_with_every_dynamic_field() -> None:
    validate(
        spec(
            task("plan"),
            task("search", ["plan"], map=MapSpec("plan", "result.queries")),
            task("summarize", ["search"], on_failure="continue"),
            task("cleanup", ["summarize"], always=True),
            task("notify", ["cleanup", "plan"], always=True),
        )
    )


def test_map_over_must_be_a_dependency() -> None:
    found = assert_only(
        spec(task("plan"), task("other"), task("search", ["other"], map=MapSpec("plan", "q"))),
        "definition.tasks[2].map.over",
    )
    assert "'plan' must be one of the task's depends_on" in found.description
    found = assert_only(
        spec(task("plan"), task("search", ["plan"], map=MapSpec("nope", "q"))),
        "definition.tasks[1].map.over",
    )
    assert "and a task of this workflow" in found.description


@pytest.mark.parametrize("path", ["", ".a", "a.", "a..b", "a b", "a/b", "x" * 300, "é"])
def test_map_path_syntax(path: str) -> None:
    found = assert_only(
        spec(task("plan"), task("search", ["plan"], map=MapSpec("plan", path))),
        "definition.tasks[1].map.path",
    )
    assert str(MAX_MAP_PATH_CHARS) in found.description


@pytest.mark.parametrize("path", ["queries", "result.items", "a-b.c_d.0", "x" * 200])
def test_map_paths_accepted(path: str) -> None:
    validate(spec(task("plan"), task("search", ["plan"], map=MapSpec("plan", path))))


def test_a_map_task_input_cannot_use_the_element_keys() -> None:
    found = assert_only(
        spec(
            task("plan"),
            task("search", ["plan"], map=MapSpec("plan", "q"), input={"item": 1, "index": 2}),
        ),
        "definition.tasks[1].input",
    )
    assert "'item' and 'index'" in found.description
    # Only a map task's: any other task may use them.
    validate(spec(task("plan", input={"item": 1, "index": 2})))


def test_always_task_rules() -> None:
    found = assert_only(
        spec(task("a"), task("b", ["a"], always=True, map=MapSpec("a", "q"))),
        "definition.tasks[1].map",
    )
    assert "cannot be a map task" in found.description
    found = assert_only(
        spec(task("a"), task("b", ["a"], always=True, on_failure="continue")),
        "definition.tasks[1].on_failure",
    )
    assert "never stops the run" in found.description
    found = assert_only(
        spec(task("a"), task("cleanup", always=True), task("b", ["a", "cleanup"])),
        "definition.tasks[2].depends_on[1]",
    )
    assert "only another `always` task may depend on it" in found.description
    found = assert_only(spec(task("a", always=True)), "definition.tasks")
    assert "at least one task must not be `always`" in found.description


def test_unknown_failure_policy() -> None:
    bad = TaskSpec(key="a", executor_kind="mock", action="x", on_failure="maybe")  # type: ignore[arg-type]
    found = assert_only(spec(bad), "definition.tasks[0].on_failure")
    assert "fail_run, continue" in found.description


def test_every_violation_is_reported_at_once() -> None:
    fields = fields_of(
        spec(
            task("a", always=True, on_failure="continue"),
            task("b", ["a"], map=MapSpec("c", "")),
        )
    )
    assert fields == [
        "definition.tasks[0].on_failure",
        "definition.tasks[1].depends_on[0]",
        "definition.tasks[1].map.over",
        "definition.tasks[1].map.path",
    ]


# --- a property: validation agrees with the rules as stated in the docs ---------------

KEYS = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=3)


@st.composite
def dynamic_specs(draw: st.DrawFn) -> WorkflowSpec:
    keys = draw(st.lists(KEYS, min_size=1, max_size=6, unique=True))
    tasks = []
    for index, key in enumerate(keys):
        deps = tuple(draw(st.lists(st.sampled_from(keys[:index]), unique=True))) if index else ()
        mapped = None
        if draw(st.booleans()):
            over = draw(st.sampled_from([*deps, "zz"])) if deps else "zz"
            mapped = MapSpec(over, draw(st.sampled_from(["q", "a.b", "", "a..b"])))
        tasks.append(
            TaskSpec(
                key=key,
                executor_kind="mock",
                action="x",
                input=draw(st.sampled_from([{}, {"item": 1}, {"other": 2}])),
                depends_on=deps,
                map=mapped,
                on_failure=draw(st.sampled_from(FAILURE_POLICIES)),
                always=draw(st.booleans()),
            )
        )
    return WorkflowSpec(name="wf", version=1, tasks=tuple(tasks))


def _follows_the_rules(workflow: WorkflowSpec) -> bool:
    always = {t.key for t in workflow.tasks if t.always}
    if len(always) == len(workflow.tasks):
        return False
    for t in workflow.tasks:
        if t.always and (t.map is not None or t.on_failure != "fail_run"):
            return False
        if not t.always and always & set(t.depends_on):
            return False
        if t.map is not None and (
            t.map.over not in t.depends_on or t.map.path in ("", "a..b") or "item" in t.input
        ):
            return False
    return True


@JSON_PROPERTY
@given(dynamic_specs())
def test_validation_agrees_with_the_stated_rules(workflow: WorkflowSpec) -> None:
    try:
        validate(workflow)
    except DefinitionInvalid as exc:
        assert not _follows_the_rules(workflow), exc.violations
        assert all(v.field.startswith("definition.tasks") for v in exc.violations)
    else:
        assert _follows_the_rules(workflow)
        assert WorkflowSpec.from_json(json.loads(json.dumps(workflow.to_json()))) == workflow
        # An always task is never unlocked by a dependency's success.
        unlocked = {key for keys in workflow.dependents().values() for key in keys}
        assert not unlocked & {t.key for t in workflow.tasks if t.always}
