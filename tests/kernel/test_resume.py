"""The reuse rule of a retried run (awp_kernel.resume): a succeeded task is reused unless
it is from_task or something upstream of it runs again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from awp_kernel.definition import WorkflowSpec
from awp_kernel.resume import reused_tasks
from kernel.definitions import spec, task

# fetch -> parse -> publish, fetch -> index, and notify on its own.
PIPELINE = spec(
    task("fetch"),
    task("parse", ["fetch"]),
    task("publish", ["parse", "index"]),
    task("index", ["fetch"]),
    task("notify"),
)
ALL = {"fetch", "parse", "publish", "index", "notify"}


def test_what_succeeded_upstream_of_every_failure_is_reused() -> None:
    assert reused_tasks(PIPELINE, {"fetch", "index", "notify"}) == {"fetch", "index", "notify"}


def test_from_task_reruns_it_and_everything_downstream() -> None:
    assert reused_tasks(PIPELINE, ALL, "parse") == {"fetch", "index", "notify"}
    assert reused_tasks(PIPELINE, ALL, "fetch") == {"notify"}
    assert reused_tasks(PIPELINE, ALL) == ALL


def test_a_success_downstream_of_a_rerun_is_run_again() -> None:
    # publish succeeded, but index (upstream of it) failed: its input would change.
    assert reused_tasks(PIPELINE, {"fetch", "parse", "publish", "notify"}) == {
        "fetch",
        "parse",
        "notify",
    }


@st.composite
def dags_and_outcomes(draw: st.DrawFn) -> tuple[WorkflowSpec, set[str], str | None]:
    size = draw(st.integers(min_value=1, max_value=12))
    keys = [f"t{i}" for i in range(size)]
    tasks = [
        task(key, sorted(draw(st.sets(st.sampled_from(keys[:i]), max_size=3)) if i else []))
        for i, key in enumerate(keys)
    ]
    succeeded = draw(st.sets(st.sampled_from(keys)))
    from_task = draw(st.none() | st.sampled_from(keys))
    return spec(*tasks), succeeded, from_task


@given(dags_and_outcomes())
def test_a_task_is_reused_exactly_when_it_and_all_upstream_of_it_are(
    case: tuple[WorkflowSpec, set[str], str | None],
) -> None:
    workflow, succeeded, from_task = case
    upstream = {t.key: set(t.depends_on) for t in workflow.tasks}

    def keeps(key: str) -> bool:
        return key in succeeded and key != from_task and all(keeps(u) for u in upstream[key])

    assert reused_tasks(workflow, succeeded, from_task) == {k for k in upstream if keeps(k)}


def test_an_always_task_is_run_again_in_every_retry() -> None:
    flow = spec(task("a"), task("b", ["a"]), task("cleanup", ["b"], always=True))
    assert reused_tasks(flow, {"a", "b", "cleanup"}) == {"a", "b"}
    assert reused_tasks(flow, {"a", "cleanup"}) == {"a"}
