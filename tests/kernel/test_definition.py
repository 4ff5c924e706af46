"""Workflow definitions: validation rules, cycle detection, JSON form and hashing."""

from __future__ import annotations

import json
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awp_kernel.definition import (
    DefinitionInvalid,
    TaskSpec,
    WorkflowSpec,
    find_cycle,
    validate,
)
from awp_kernel.retry import RetryPolicy
from awp_protocol.errors import FieldViolation
from awp_protocol.jsonvalue import canonical_json, json_size
from awp_protocol.limits import (
    DEFAULT_TIMEOUT_MS,
    MAX_ATTEMPTS,
    MAX_BACKOFF_MULTIPLIER,
    MAX_CONCURRENCY,
    MAX_DESCRIPTION_CHARS,
    MAX_DURATION_MS,
    MAX_INPUT_BYTES,
    MAX_TASKS,
    MAX_VERSION,
    MIN_TIMEOUT_MS,
)

PROPERTY = settings(max_examples=200, deadline=None)
# Generating whole workflows with JSON inputs is costlier: fewer examples keep the suite fast.
SPEC_PROPERTY = settings(max_examples=60, deadline=None)


def task(key: str = "a", deps: Sequence[str] = (), **kwargs: Any) -> TaskSpec:
    kwargs.setdefault("executor_kind", "mock")
    kwargs.setdefault("action", "reports.summarize")
    return TaskSpec(key=key, depends_on=tuple(deps), **kwargs)


def spec(*tasks: TaskSpec, **kwargs: Any) -> WorkflowSpec:
    kwargs.setdefault("name", "wf")
    kwargs.setdefault("version", 1)
    return WorkflowSpec(tasks=tasks or (task(),), **kwargs)


def violations_of(workflow: WorkflowSpec, **kwargs: Any) -> tuple[FieldViolation, ...]:
    with pytest.raises(DefinitionInvalid) as caught:
        validate(workflow, **kwargs)
    assert caught.value.violations, "DefinitionInvalid must carry at least one violation"
    return caught.value.violations


def fields_of(workflow: WorkflowSpec, **kwargs: Any) -> list[str]:
    return [v.field for v in violations_of(workflow, **kwargs)]


def assert_only(workflow: WorkflowSpec, field: str) -> FieldViolation:
    """The spec is rejected with exactly one violation, on `field`."""
    found = violations_of(workflow)
    assert [v.field for v in found] == [field], found
    assert found[0].description
    return found[0]


def retry_task(**retry: Any) -> TaskSpec:
    return task(retry=RetryPolicy(**retry))


# --- accepted definitions ------------------------------------------------------------------


def test_minimal_workflow_is_valid_and_returned_unchanged() -> None:
    workflow = spec()
    assert validate(workflow) is workflow


def test_diamond_is_valid() -> None:
    workflow = spec(
        task("fetch"),
        task("left", ["fetch"]),
        task("right", ["fetch"]),
        task("join", ["left", "right"]),
    )
    assert validate(workflow) is workflow


def test_dependency_may_be_declared_after_its_dependent() -> None:
    # Order of the task list is not a topological order requirement.
    assert validate(spec(task("b", ["a"]), task("a")))


def test_boundary_values_are_all_accepted() -> None:
    workflow = spec(
        task(
            "k" * 64,
            action="A" + "a" * 127,
            input={"x": "y" * (MAX_INPUT_BYTES - len('{"x":""}'))},
            timeout_ms=MIN_TIMEOUT_MS,
            retry=RetryPolicy(
                max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0, multiplier=1.0
            ),
        ),
        task(
            "other",
            action="_x",
            timeout_ms=MAX_DURATION_MS,
            retry=RetryPolicy(
                max_attempts=MAX_ATTEMPTS,
                initial_backoff_ms=MAX_DURATION_MS,
                max_backoff_ms=MAX_DURATION_MS,
                multiplier=MAX_BACKOFF_MULTIPLIER,
            ),
        ),
        name="n" * 128,
        version=MAX_VERSION,
        description="d" * MAX_DESCRIPTION_CHARS,
        concurrency=MAX_CONCURRENCY,
    )
    assert validate(workflow) is workflow


def test_known_kinds_can_be_supplied() -> None:
    workflow = spec(task(executor_kind="gpu"))
    assert validate(workflow, known_kinds=frozenset({"gpu"})) is workflow
    assert fields_of(spec(task(executor_kind="mock")), known_kinds=frozenset({"gpu"})) == [
        "definition.tasks[0].executor_kind"
    ]


# --- workflow-level rules ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ok", "A.b-c_9", "x" * 128])
def test_good_names(name: str) -> None:
    validate(spec(name=name))


@pytest.mark.parametrize(
    "name",
    ["", "has space", "x" * 129, "a/b", "naïve", "wf\n", "\nwf", "wf\t", "a:b", "wf\x00"],
)
def test_bad_name(name: str) -> None:
    assert_only(spec(name=name), "definition.name")


@pytest.mark.parametrize("version", [0, -1, MAX_VERSION + 1, 2**32 - 1])
def test_bad_version(version: int) -> None:
    assert_only(spec(version=version), "definition.version")


def test_description_too_long() -> None:
    assert_only(spec(description="d" * (MAX_DESCRIPTION_CHARS + 1)), "definition.description")


@pytest.mark.parametrize("concurrency", [-1, MAX_CONCURRENCY + 1])
def test_bad_concurrency(concurrency: int) -> None:
    assert_only(spec(concurrency=concurrency), "definition.concurrency")


def test_no_tasks() -> None:
    assert_only(WorkflowSpec(name="wf", version=1, tasks=()), "definition.tasks")


def test_too_many_tasks() -> None:
    tasks = tuple(task(f"t{i}") for i in range(MAX_TASKS + 1))
    violation = assert_only(spec(*tasks), "definition.tasks")
    assert str(MAX_TASKS) in violation.description


def test_exactly_max_tasks_is_fine() -> None:
    validate(spec(*(task(f"t{i}") for i in range(MAX_TASKS))))


# --- task keys and dependencies ------------------------------------------------------------


def test_duplicate_key_names_the_second_occurrence() -> None:
    violation = assert_only(spec(task("a"), task("b"), task("a")), "definition.tasks[2].key")
    assert "tasks[0]" in violation.description


@pytest.mark.parametrize("key", ["", "a b", "k" * 65, "a/b", "k\n", "ключ"])
def test_bad_task_key(key: str) -> None:
    assert_only(spec(task("ok"), task(key)), "definition.tasks[1].key")


def test_unknown_dependency() -> None:
    violation = assert_only(
        spec(task("a"), task("b", ["a", "nope"])), "definition.tasks[1].depends_on[1]"
    )
    assert "nope" in violation.description


def test_unknown_dependency_first_position() -> None:
    assert_only(spec(task("a"), task("b", ["missing"])), "definition.tasks[1].depends_on[0]")


def test_self_dependency() -> None:
    assert_only(spec(task("a"), task("b", ["b"])), "definition.tasks[1].depends_on[0]")


def test_duplicate_dependency_names_the_repeat() -> None:
    violation = assert_only(
        spec(task("a"), task("c"), task("b", ["a", "c", "a"])),
        "definition.tasks[2].depends_on[2]",
    )
    assert "twice" in violation.description


def test_two_cycle_is_rejected_naming_a_task_in_it() -> None:
    violation = assert_only(
        spec(task("root"), task("a", ["b"]), task("b", ["a"])), "definition.tasks[1].depends_on"
    )
    assert violation.description == "dependency cycle: a -> b -> a"


def test_long_cycle_is_rejected() -> None:
    workflow = spec(task("a", ["c"]), task("b", ["a"]), task("c", ["b"]), task("free"))
    violation = assert_only(workflow, "definition.tasks[0].depends_on")
    assert violation.description == "dependency cycle: a -> c -> b -> a"


# --- task fields ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["shell", "", "MOCK", "python3", " mock"])
def test_unknown_executor_kind(kind: str) -> None:
    violation = assert_only(spec(task(executor_kind=kind)), "definition.tasks[0].executor_kind")
    assert "mock" in violation.description


@pytest.mark.parametrize(
    "action",
    [
        "/bin/sh",
        "http://x",
        "https://example.com/hook",
        "rm -rf /",
        "sh -c 'echo hi'",
        "a;b",
        "$(whoami)",
        "`id`",
        "../etc/passwd",
        "C:\\Windows\\cmd.exe",
        "a|b",
        "1starts_with_digit",
        ".hidden",
        "",
        "a" * 129,
        "run\n",
        "run\nrm -rf /",
    ],
)
def test_bad_action(action: str) -> None:
    assert_only(spec(task(action=action)), "definition.tasks[0].action")


@pytest.mark.parametrize(
    "action", ["reports.summarize", "module:function", "_private", "a-b.c:d_e", "x"]
)
def test_good_action(action: str) -> None:
    validate(spec(task(action=action)))


def test_input_over_64_kib() -> None:
    filler = "x" * (MAX_INPUT_BYTES - len('{"x":""}'))
    validate(spec(task(input={"x": filler})))
    violation = assert_only(spec(task(input={"x": filler + "x"})), "definition.tasks[0].input")
    assert str(MAX_INPUT_BYTES) in violation.description


def test_input_size_counts_utf8_bytes_not_characters() -> None:
    chars = (MAX_INPUT_BYTES - len('{"x":""}')) // 2 + 1
    assert_only(spec(task(input={"x": "é" * chars})), "definition.tasks[0].input")


@pytest.mark.parametrize(
    "bad_input",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": [1.0, -math.inf]},
        {"x": {1, 2}},
        {"x": object()},
        {"x": "\ud800"},
        {1: "a", "b": 2},
    ],
)
def test_input_that_is_not_json_is_a_violation_not_a_crash(bad_input: dict[Any, Any]) -> None:
    assert_only(spec(task(input=bad_input)), "definition.tasks[0].input")


@pytest.mark.parametrize("timeout_ms", [MIN_TIMEOUT_MS - 1, 0, -1, MAX_DURATION_MS + 1])
def test_timeout_bounds(timeout_ms: int) -> None:
    assert_only(spec(task(timeout_ms=timeout_ms)), "definition.tasks[0].timeout")


def test_default_timeout_is_valid() -> None:
    assert task().timeout_ms == DEFAULT_TIMEOUT_MS
    validate(spec())


@pytest.mark.parametrize("max_attempts", [0, -1, MAX_ATTEMPTS + 1])
def test_max_attempts_bounds(max_attempts: int) -> None:
    assert_only(
        spec(retry_task(max_attempts=max_attempts)), "definition.tasks[0].retry.max_attempts"
    )


def test_negative_initial_backoff() -> None:
    assert_only(
        spec(retry_task(initial_backoff_ms=-1)), "definition.tasks[0].retry.initial_backoff"
    )


def test_initial_backoff_over_24h() -> None:
    fields = fields_of(
        spec(retry_task(initial_backoff_ms=MAX_DURATION_MS + 1, max_backoff_ms=MAX_DURATION_MS + 1))
    )
    assert "definition.tasks[0].retry.initial_backoff" in fields
    assert set(fields) <= {
        "definition.tasks[0].retry.initial_backoff",
        "definition.tasks[0].retry.max_backoff",
    }


@pytest.mark.parametrize(("initial", "maximum"), [(1_000, 999), (0, MAX_DURATION_MS + 1), (5, -1)])
def test_max_backoff_bounds(initial: int, maximum: int) -> None:
    assert_only(
        spec(retry_task(initial_backoff_ms=initial, max_backoff_ms=maximum)),
        "definition.tasks[0].retry.max_backoff",
    )


@pytest.mark.parametrize(
    "multiplier", [0.0, 0.999, -2.0, MAX_BACKOFF_MULTIPLIER + 0.001, math.nan, math.inf]
)
def test_multiplier_bounds(multiplier: float) -> None:
    assert_only(
        spec(retry_task(multiplier=multiplier)), "definition.tasks[0].retry.backoff_multiplier"
    )


def test_every_violation_is_reported_at_once() -> None:
    workflow = WorkflowSpec(
        name="bad name",
        version=0,
        tasks=(
            task("a"),
            task("a", ["ghost"], action="/bin/sh", executor_kind="shell", timeout_ms=0),
        ),
    )
    fields = fields_of(workflow)
    assert fields == [
        "definition.name",
        "definition.version",
        "definition.tasks[1].key",
        "definition.tasks[1].executor_kind",
        "definition.tasks[1].action",
        "definition.tasks[1].timeout",
        "definition.tasks[1].depends_on[0]",
    ]


def test_definition_invalid_message_lists_fields() -> None:
    with pytest.raises(ValueError, match=r"definition\.name: .*; definition\.version: "):
        validate(spec(name="", version=0))


# --- cycles, by property -------------------------------------------------------------------


def reference_is_acyclic(edges: Mapping[str, Sequence[str]]) -> bool:
    """Kahn-style: repeatedly remove nodes whose dependencies are all removed."""
    remaining = {node: set(deps) for node, deps in edges.items()}
    while True:
        free = [node for node, deps in remaining.items() if not deps & remaining.keys()]
        if not free:
            return not remaining
        for node in free:
            del remaining[node]


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, list[str]]:
    """Random dependency graphs: a random DAG, plus (sometimes) arbitrary extra edges."""
    size = draw(st.integers(min_value=1, max_value=10))
    nodes = [f"t{i}" for i in range(size)]
    order = draw(st.permutations(nodes))
    edges: dict[str, list[str]] = {}
    for rank, node in enumerate(order):
        earlier = list(order[:rank])
        edges[node] = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
    extra = draw(st.lists(st.tuples(st.sampled_from(nodes), st.sampled_from(nodes)), max_size=3))
    for source, target in extra:
        if source != target and target not in edges[source]:
            edges[source].append(target)
    for node in nodes:
        edges[node] = draw(st.permutations(edges[node]))
    shuffled = draw(st.permutations(nodes))
    return {node: edges[node] for node in shuffled}


def tasks_of(edges: Mapping[str, Sequence[str]]) -> tuple[TaskSpec, ...]:
    return tuple(task(node, deps) for node, deps in edges.items())


def assert_real_cycle(cycle: list[str], edges: Mapping[str, Sequence[str]]) -> None:
    assert cycle, "a cycle has at least one node"
    assert len(set(cycle)) == len(cycle), f"a simple cycle repeats no node: {cycle}"
    for here, there in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
        assert there in edges[here], f"{here} -> {there} is not an edge of {edges}"


@PROPERTY
@given(graphs())
def test_validate_accepts_exactly_the_acyclic_graphs(edges: dict[str, list[str]]) -> None:
    """And find_cycle agrees: None exactly for DAGs, else a real cycle of the graph."""
    workflow = spec(*tasks_of(edges))
    cycle = find_cycle(workflow.tasks)
    if reference_is_acyclic(edges):
        assert cycle is None
        assert validate(workflow) is workflow
        return
    assert cycle is not None
    assert_real_cycle(cycle, edges)
    found = violations_of(workflow)
    assert len(found) == 1
    (violation,) = found
    assert violation.description.startswith("dependency cycle: ")
    keys = list(edges)
    prefix, suffix = "definition.tasks[", "].depends_on"
    assert violation.field.startswith(prefix)
    assert violation.field.endswith(suffix)
    named = keys[int(violation.field[len(prefix) : -len(suffix)])]
    path = violation.description.removeprefix("dependency cycle: ").split(" -> ")
    assert path[0] == path[-1] == named
    assert_real_cycle(path[:-1], edges)


def test_find_cycle_self_loop() -> None:
    assert find_cycle([task("a", ["a"])]) == ["a"]


def test_find_cycle_ignores_unknown_dependencies() -> None:
    assert find_cycle([task("a", ["ghost"]), task("b", ["a"])]) is None


def test_ten_thousand_task_chain_validates_without_recursion() -> None:
    tasks = [task("t0")] + [task(f"t{i}", [f"t{i - 1}"]) for i in range(1, MAX_TASKS)]
    workflow = spec(*tasks)
    assert validate(workflow) is workflow
    assert find_cycle(tasks) is None


def test_ten_thousand_task_ring_is_found_without_recursion() -> None:
    n = MAX_TASKS
    tasks = [task(f"t{i}", [f"t{(i - 1) % n}"]) for i in range(n)]
    cycle = find_cycle(tasks)
    assert cycle is not None
    assert len(cycle) == n
    assert_real_cycle(cycle, {t.key: t.depends_on for t in tasks})
    assert_only(spec(*tasks), "definition.tasks[0].depends_on")


# --- JSON form and hashing -----------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=4), json_values, max_size=4)

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


def reorder(value: Any) -> Any:
    """The same JSON value with every object's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {key: reorder(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(item) for item in value]
    return value


@SPEC_PROPERTY
@given(workflow_specs())
def test_to_json_from_json_round_trip(workflow: WorkflowSpec) -> None:
    assert validate(workflow) is workflow
    data = workflow.to_json()
    assert WorkflowSpec.from_json(data) == workflow
    # Through real JSON text too, as the definition is stored as jsonb.
    reloaded = WorkflowSpec.from_json(json.loads(json.dumps(data)))
    assert reloaded == workflow
    assert reloaded.definition_hash() == workflow.definition_hash()


@SPEC_PROPERTY
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
