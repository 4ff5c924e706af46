"""Name patterns and the Register checks shared by the server and the worker (no I/O)."""

from __future__ import annotations

import pytest

from awp_protocol.errors import FieldsInvalid, Reason
from awp_protocol.limits import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_WORKER_CONCURRENCY,
    MAX_WORKER_NAME_CHARS,
)
from awp_protocol.names import (
    ACTION_PATTERN,
    EXECUTOR_KIND_PATTERN,
    LABEL_KEY_PATTERN,
    NAME_PATTERN,
    TASK_KEY_PATTERN,
    RegisterInvalid,
    check_register,
)

GOOD: dict[str, object] = {
    "name": "w",
    "executor_kinds": ["mock"],
    "max_concurrency": 1,
    "labels": {},
}


def fields_refused(**changes: object) -> list[str]:
    request = {**GOOD, **changes}
    try:
        check_register(**request)  # type: ignore[arg-type]
    except RegisterInvalid as exc:
        return [v.field for v in exc.violations]
    return []


@pytest.mark.parametrize(
    ("pattern", "longest"),
    [
        (NAME_PATTERN, "n" * 128),
        (TASK_KEY_PATTERN, "k" * 64),
        (ACTION_PATTERN, "a" * 128),
        (EXECUTOR_KIND_PATTERN, "k" * 32),
        (LABEL_KEY_PATTERN, "l" * 63),
    ],
)
def test_patterns_have_their_bounds_and_refuse_a_trailing_newline(
    pattern: object, longest: str
) -> None:
    assert pattern.fullmatch(longest)  # type: ignore[attr-defined]
    assert not pattern.fullmatch(longest + longest[0])  # type: ignore[attr-defined]
    assert not pattern.fullmatch(longest[:1] + "\n")  # type: ignore[attr-defined]
    assert not pattern.fullmatch("")  # type: ignore[attr-defined]


def test_a_good_register_passes() -> None:
    assert fields_refused() == []
    assert (
        fields_refused(
            name="n" * MAX_WORKER_NAME_CHARS,
            executor_kinds=["k" * 32, "python"],
            max_concurrency=MAX_WORKER_CONCURRENCY,
            labels={f"k{i}": "v" * MAX_LABEL_VALUE_CHARS for i in range(MAX_LABELS)},
        )
        == []
    )


@pytest.mark.parametrize(
    ("changes", "fields"),
    [
        ({"name": ""}, ["name"]),
        ({"name": "n" * (MAX_WORKER_NAME_CHARS + 1)}, ["name"]),
        ({"executor_kinds": []}, ["executor_kinds"]),
        ({"executor_kinds": ["mock", "k" * 33]}, ["executor_kinds[1]"]),
        ({"executor_kinds": ["Mock"]}, ["executor_kinds[0]"]),
        ({"executor_kinds": ["mock", "mock"]}, ["executor_kinds"]),
        ({"max_concurrency": 0}, ["max_concurrency"]),
        ({"max_concurrency": MAX_WORKER_CONCURRENCY + 1}, ["max_concurrency"]),
        ({"labels": {f"k{i}": "" for i in range(MAX_LABELS + 1)}}, ["labels"]),
        ({"labels": {"bad key": ""}}, ["labels['bad key']"]),
        ({"labels": {"k": "v" * (MAX_LABEL_VALUE_CHARS + 1)}}, ["labels['k']"]),
        ({"name": "", "max_concurrency": 0}, ["name", "max_concurrency"]),
    ],
)
def test_each_rule_names_its_field(changes: dict[str, object], fields: list[str]) -> None:
    assert fields_refused(**changes) == fields


def test_the_message_names_the_callers_settings() -> None:
    with pytest.raises(RegisterInvalid) as caught:
        check_register("w", ["k" * 40], 0, {}, settings={"executor_kinds": "--kinds"})
    error = caught.value
    assert str(error).startswith("--kinds: 'kkkk")
    assert "1-32 characters" in str(error)
    assert "max_concurrency: must be 1 to 1000" in str(error)  # no setting given: the field
    # On the wire the violations keep the request's field names.
    assert [v.field for v in error.violations] == ["executor_kinds[0]", "max_concurrency"]
    assert isinstance(error, FieldsInvalid) and isinstance(error, ValueError)
    assert error.reason == Reason.INVALID_ARGUMENT
