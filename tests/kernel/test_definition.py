"""Workflow definitions: the validation rules, one by one and all at once."""

from __future__ import annotations

import math
from typing import Any

import pytest
from definitions import assert_only, fields_of, spec, task

from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.retry import RetryPolicy
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
