"""Workflow definitions: cycle detection, by property against a reference and at scale."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from definitions import assert_only, spec, task, violations_of
from hypothesis import given
from hypothesis import strategies as st

from awp_kernel.definition import TaskSpec, find_cycle, validate
from awp_protocol.limits import MAX_TASKS
from kit.strategies import PROPERTY

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
