"""Workflow definitions: the JSON form (round trip, defaults, canonical bytes) and the
definition hash."""

from __future__ import annotations

import json
import string

from definitions import spec, task
from hypothesis import given
from hypothesis import strategies as st

from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.retry import RetryPolicy
from awp_protocol.jsonvalue import canonical_json, json_size
from awp_protocol.limits import (
    DEFAULT_TIMEOUT_MS,
    MAX_ATTEMPTS,
    MAX_BACKOFF_MULTIPLIER,
    MAX_CONCURRENCY,
    MAX_DURATION_MS,
    MAX_VERSION,
    MIN_TIMEOUT_MS,
)
from kit import strategies
from kit.strategies import JSON_PROPERTY, reorder

json_objects = strategies.json_objects(max_leaves=6, max_keys=4)
KEY_CHARS = string.ascii_letters + string.digits + "_.-"
keys = st.text(alphabet=KEY_CHARS, min_size=1, max_size=12)
actions = st.builds(
    str.__add__,
    st.sampled_from(string.ascii_letters + "_"),
    st.text(alphabet=KEY_CHARS + ":", max_size=20),
)


@st.composite
def workflow_specs(draw: st.DrawFn) -> WorkflowSpec:
    task_keys = draw(st.lists(keys, min_size=1, max_size=5, unique=True))
    tasks = []
    for index, key in enumerate(task_keys):
        earlier = task_keys[:index]
        deps = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
        initial = draw(st.integers(min_value=0, max_value=MAX_DURATION_MS))
        tasks.append(
            TaskSpec(
                key=key,
                executor_kind=draw(st.sampled_from(["mock", "python"])),
                action=draw(actions),
                input=draw(json_objects),
                depends_on=tuple(deps),
                retry=RetryPolicy(
                    max_attempts=draw(st.integers(min_value=1, max_value=MAX_ATTEMPTS)),
                    initial_backoff_ms=initial,
                    max_backoff_ms=draw(st.integers(min_value=initial, max_value=MAX_DURATION_MS)),
                    multiplier=draw(st.floats(min_value=1.0, max_value=MAX_BACKOFF_MULTIPLIER)),
                ),
                timeout_ms=draw(st.integers(min_value=MIN_TIMEOUT_MS, max_value=MAX_DURATION_MS)),
            )
        )
    return WorkflowSpec(
        name=draw(keys),
        version=draw(st.integers(min_value=1, max_value=MAX_VERSION)),
        tasks=tuple(tasks),
        description=draw(st.text(max_size=40)),
        concurrency=draw(st.integers(min_value=0, max_value=MAX_CONCURRENCY)),
    )


@JSON_PROPERTY
@given(workflow_specs())
def test_to_json_from_json_round_trip(workflow: WorkflowSpec) -> None:
    assert validate(workflow) is workflow
    data = workflow.to_json()
    assert WorkflowSpec.from_json(data) == workflow
    # Through real JSON text too, as the definition is stored as jsonb.
    reloaded = WorkflowSpec.from_json(json.loads(json.dumps(data)))
    assert reloaded == workflow
    assert reloaded.definition_hash() == workflow.definition_hash()


@JSON_PROPERTY
@given(workflow_specs())
def test_definition_hash_ignores_input_key_order(workflow: WorkflowSpec) -> None:
    reordered = WorkflowSpec(
        name=workflow.name,
        version=workflow.version,
        description=workflow.description,
        concurrency=workflow.concurrency,
        tasks=tuple(
            TaskSpec(
                key=t.key,
                executor_kind=t.executor_kind,
                action=t.action,
                input=reorder(dict(t.input)),
                depends_on=t.depends_on,
                retry=t.retry,
                timeout_ms=t.timeout_ms,
            )
            for t in workflow.tasks
        ),
    )
    assert reordered.definition_hash() == workflow.definition_hash()
    assert len(workflow.definition_hash()) == 32


def test_definition_hash_changes_with_the_definition() -> None:
    base = spec(task("a", input={"n": 1}), task("b", ["a"]))
    variants = [
        spec(task("a", input={"n": 1}), task("b", ["a"]), version=2),
        spec(task("a", input={"n": 2}), task("b", ["a"])),
        spec(task("a", input={"n": 1}), task("b")),
        spec(task("a", input={"n": 1}), task("b", ["a"], timeout_ms=11)),
        spec(task("a", input={"n": 1}), task("b", ["a"], action="other")),
        spec(task("a", input={"n": 1}), task("b", ["a"], retry=RetryPolicy(max_attempts=4))),
        spec(task("a", input={"n": 1}), task("b", ["a"]), description="x"),
        spec(task("a", input={"n": 1}), task("b", ["a"]), concurrency=1),
    ]
    hashes = {base.definition_hash(), *(v.definition_hash() for v in variants)}
    assert len(hashes) == len(variants) + 1


def test_from_json_defaults() -> None:
    retry = {"max_attempts": 3, "initial_backoff_ms": 1000, "max_backoff_ms": 60000}
    data = {
        "name": "wf",
        "version": 1,
        "tasks": [
            {
                "key": "a",
                "executor_kind": "mock",
                "action": "x",
                "retry": {**retry, "multiplier": 2.0},
                "timeout_ms": DEFAULT_TIMEOUT_MS,
            }
        ],
    }
    workflow = WorkflowSpec.from_json(data)
    assert workflow == spec(task("a", action="x"))
    assert workflow.description == ""
    assert workflow.concurrency == 0


def test_dependents_are_the_reverse_edges() -> None:
    workflow = spec(task("a"), task("b", ["a"]), task("c", ["a", "b"]), task("d"))
    assert workflow.dependents() == {"a": ["b", "c"], "b": ["c"], "c": [], "d": []}


def test_canonical_json_is_compact_sorted_utf8() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": "é"}]}) == (
        '{"a":[1,{"c":"é","d":null}],"b":1}'.encode()
    )
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1})
    assert json_size({"x": "é"}) == len('{"x":""}') + 2
