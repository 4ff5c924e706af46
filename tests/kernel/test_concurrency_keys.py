"""Concurrency keys: the template grammar, its refusals at definition time (naming the
task and the template), rendering from a run's input, and the definition's JSON."""

from __future__ import annotations

import contextlib

import pytest
from definitions import assert_only, spec, task
from hypothesis import given
from hypothesis import strategies as st

from awp_kernel import concurrency
from awp_kernel.concurrency import ConcurrencyLimit, KeyTemplateInvalid, KeyUnrenderable
from awp_kernel.definition import WorkflowSpec, validate
from awp_protocol.limits import MAX_CONCURRENCY_LIMITS, MAX_KEY_TEMPLATE_CHARS


@pytest.mark.parametrize(
    ("template", "run_input", "key"),
    [
        ("llm", {}, "llm"),
        ("user:{input.user_id}", {"user_id": 42}, "user:42"),
        ("user:{input.user_id}", {"user_id": "ann"}, "user:ann"),
        ("{input.org.id}/{input.tier}", {"org": {"id": "o1"}, "tier": "gold"}, "o1/gold"),
        ("first={input.ids.0}", {"ids": ["a", "b"]}, "first=a"),
        ("flag:{input.on}", {"on": True}, "flag:true"),
    ],
)
def test_a_template_renders_from_the_run_input(
    template: str, run_input: dict[str, object], key: str
) -> None:
    assert concurrency.render(template, run_input) == key


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("", "is empty"),
        ("user {input.id}", "unexpected ' ' at character 5"),
        ("user:{input}", "unexpected '{' at character 6"),
        ("user:{run.id}", "unexpected '{' at character 6"),
        ("user:{input.id", "unexpected '{' at character 6"),
        ("{input.__class__.x}}", "unexpected '}' at character 20"),
        ("a" * (MAX_KEY_TEMPLATE_CHARS + 1), f"longer than {MAX_KEY_TEMPLATE_CHARS}"),
    ],
)
def test_a_template_outside_the_grammar_is_refused_saying_where(template: str, words: str) -> None:
    with pytest.raises(KeyTemplateInvalid, match=words.replace("{", r"\{")):
        concurrency.parse(template)


@pytest.mark.parametrize(
    ("run_input", "words"),
    [
        ({}, "{input.user} is not in the run's input"),
        ({"user": {"name": "x"}}, "{input.user.id} is not in the run's input"),
        ({"user": {"id": None}}, "{input.user.id} is NoneType"),
        ({"user": {"id": 1.5}}, "{input.user.id} is float"),
        ({"user": {"id": [1]}}, "{input.user.id} is list"),
    ],
)
def test_an_input_without_a_scalar_where_a_placeholder_points_cannot_render(
    run_input: dict[str, object], words: str
) -> None:
    with pytest.raises(KeyUnrenderable) as caught:
        concurrency.render("u:{input.user.id}", run_input)
    assert words in str(caught.value)


def test_a_bad_template_refuses_the_definition_naming_the_task_and_template() -> None:
    bad = task("answer", concurrency_limits=(ConcurrencyLimit("user:{input.user id}", 2),))
    violation = assert_only(spec(bad), "definition.tasks[0].concurrency_limits[0].key")
    assert "task 'answer'" in violation.description
    assert "'user:{input.user id}'" in violation.description


@pytest.mark.parametrize("most", [0, 100_001])
def test_a_max_out_of_range_is_refused(most: int) -> None:
    bad = task("answer", concurrency_limits=(ConcurrencyLimit("llm", most),))
    violation = assert_only(spec(bad), "definition.tasks[0].concurrency_limits[0].max")
    assert "1 to 100000" in violation.description


def test_a_key_listed_twice_and_too_many_limits_are_refused() -> None:
    twice = task("a", concurrency_limits=(ConcurrencyLimit("llm", 1), ConcurrencyLimit("llm", 2)))
    assert_only(spec(twice), "definition.tasks[0].concurrency_limits[1].key")
    many = task(
        "a",
        concurrency_limits=tuple(
            ConcurrencyLimit(f"k{i}", 1) for i in range(MAX_CONCURRENCY_LIMITS + 1)
        ),
    )
    assert_only(spec(many), "definition.tasks[0].concurrency_limits")


def test_limits_travel_in_the_definition_json_and_only_when_declared() -> None:
    plain = spec(task("a"))
    assert "concurrency_limits" not in plain.to_json()["tasks"][0]
    keyed = spec(task("a", concurrency_limits=(ConcurrencyLimit("user:{input.u}", 2),)))
    validate(keyed)
    data = keyed.to_json()
    assert data["tasks"][0]["concurrency_limits"] == [{"key": "user:{input.u}", "max": 2}]
    assert WorkflowSpec.from_json(data) == keyed
    assert keyed.definition_hash() != plain.definition_hash()


_TEXT = st.text(alphabet="ab{}.:_ -/input0", max_size=30)


@given(_TEXT, st.dictionaries(st.sampled_from(["input", "a", "b", "0"]), st.integers()))
def test_any_text_either_parses_and_renders_or_is_refused_with_the_named_errors(
    template: str, run_input: dict[str, int]
) -> None:
    """No template reaches anything but the run input's fields: it parses into literals
    and paths, or is refused; rendering gives text or KeyUnrenderable, nothing else."""
    try:
        parts = concurrency.parse(template)
    except KeyTemplateInvalid:
        return
    assert "".join(p if isinstance(p, str) else "{input." + ".".join(p) + "}" for p in parts) == (
        template
    )
    with contextlib.suppress(KeyUnrenderable):
        assert isinstance(concurrency.render(template, run_input), str)
