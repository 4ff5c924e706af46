"""Workflow files: the readable format, its aliases, and errors that point at file lines."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from google.protobuf import json_format

from awp.v1 import types_pb2
from awp_cli.dev.command import demo_workflow
from awp_cli.errors import CliError, Exit
from awp_cli.workflow_file import load, parse_field
from awp_common.durations import DURATION_HELP, format_duration, parse_duration
from cli.runner import awp

DEMO = demo_workflow()


def write(tmp_path: Path, text: str, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path) -> tuple[str, ...]:
    with pytest.raises(CliError) as caught:
        load(path)
    assert caught.value.code == Exit.USAGE
    return (caught.value.message, *caught.value.details)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        ("1d12h", 129600.0),
        (".5s", 0.5),
        (3, 3.0),
        (0.1, 0.1),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "1", "1 s", "-1s", "1w", True, None, [], -2])
def test_not_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (1.5, "1.5s"), (60, "1m"), (5400, "1h30m"), (61, "1m1s"), (2_592_000, "30d")],
)
def test_durations_are_written_back_the_same_way(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_the_demo_workflow_loads() -> None:
    loaded = load(DEMO)
    d = loaded.definition
    assert (d.name, d.version, d.concurrency, len(d.tasks)) == ("research-digest", 2, 4, 5)
    summarize = next(t for t in d.tasks if t.key == "summarize")
    assert summarize.retry.initial_backoff.ToMilliseconds() == 300
    assert list(summarize.depends_on) == ["search"]
    assert (d.tasks[1].map.over, d.tasks[1].map.path) == ("plan", "queries")
    assert d.tasks[4].always
    assert loaded.where(("tasks", 2, "retry")) == f"{DEMO}:35"


def test_defaults_and_aliases(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: w\ntasks:\n"
        "  - {key: a, executorKind: mock, action: x, dependsOn: b,"
        " retry: {maxAttempts: 2, backoffMultiplier: 1.5}}\n"
        "  - {key: b, executor_kind: mock, action: x, input: null}\n",
    )
    d = load(path).definition
    assert d.version == 1  # unless told
    assert [t.executor_kind for t in d.tasks] == ["mock", "mock"]
    assert list(d.tasks[0].depends_on) == ["b"]
    assert (d.tasks[0].retry.max_attempts, d.tasks[0].retry.backoff_multiplier) == (2, 1.5)
    assert not d.tasks[1].HasField("retry") and not d.tasks[1].HasField("timeout")


def test_a_get_json_answer_is_accepted_back(tmp_path: Path) -> None:
    exported = {
        "definition": json_format.MessageToDict(load(DEMO).definition),
        "createdAt": "2026-01-01T00:00:00Z",
    }
    path = write(tmp_path, json.dumps(exported), "exported.json")
    assert load(path).definition == load(DEMO).definition


def test_every_shape_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
name: w
version: 1.5
tasks:
  - key: a
    kind: mock
    action: x
    timeout: soon
    retry: {max_attempts: "3", initial_backoff: 1x}
    depends-on: [b]
  - key: b
    action: x
    input: {when: 2024-01-01}
  - just a string
""",
    )
    message, *found = problems(path)
    assert message == f"{path}: 8 problems in the workflow file"
    assert found == [
        f"{path}:2: version: expected a whole number, got 1.5",
        f"{path}:9: tasks[0].depends-on: unknown field 'depends-on' (did you mean 'depends_on'?)",
        f"{path}:8: tasks[0].retry.max_attempts: expected a whole number, got '3'",
        f"{path}:8: tasks[0].retry.initial_backoff: expected {DURATION_HELP}, got '1x'",
        f"{path}:7: tasks[0].timeout: expected {DURATION_HELP}, got 'soon'",
        f"{path}:10: tasks[1]: missing kind (or executor_kind)",
        f"{path}:12: tasks[1].input.when: a date is not a JSON value (make it a string)",
        f"{path}:13: tasks[2]: expected a mapping, got a string",
    ]


def test_syntax_errors_name_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: w\ntasks:\n  - key: [a\n")
    (message,) = problems(path)
    assert message.startswith(f"{path}:4:1: invalid YAML: ")
    bad_json = write(tmp_path, '{"name": "w",\n "tasks": [}', "w.json")
    (message,) = problems(bad_json)
    assert message.startswith(f"{bad_json}:2:12: invalid JSON: ")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the file is empty"),
        ("- a\n- b\n", "expected a mapping, got a list"),
        ("name: w\n", "tasks: expected a non-empty list of tasks"),
        ("name: w\ntasks: []\n", "tasks: expected a non-empty list of tasks"),
        ("tasks: [{key: a, kind: mock, action: x}]\n", "name: a workflow needs a name"),
    ],
)
def test_empty_or_misshapen_files(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    assert any(problem in line for line in problems(path))


def test_an_unreadable_file(tmp_path: Path) -> None:
    (message,) = problems(tmp_path / "missing.yaml")
    assert (
        message
        == f"cannot read workflow file {tmp_path / 'missing.yaml'}: No such file or directory"
    )
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    (message,) = problems(binary)
    assert message.startswith(f"{binary}: not UTF-8 text")


def test_server_violations_point_at_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: w\ntasks:\n  - key: a\n    kind: mock\n    action: x\n"
        "    retry: {max_attempts: 2, multiplier: 1.5}\n",
    )
    # Valid here (the rules are checked locally too): a server of another version may
    # still refuse it, and its violations name fields of the file all the same.
    loaded = load(path)
    assert loaded.explain(
        (
            ("definition.tasks[0].retry.backoff_multiplier", "must be >= 1"),
            ("definition.tasks[0].executor_kind", "unknown kind"),
            ("definition.tasks[7].key", "no such task"),
        )
    ) == (
        f"{path}:6: tasks[0].retry.multiplier: must be >= 1",
        f"{path}:4: tasks[0].kind: unknown kind",
        f"{path}:3: tasks[7].key: no such task",  # the nearest line: the list's
    )
    assert parse_field("definition.tasks[12].depends_on[3]") == ("tasks", 12, "depends_on", 3)


def test_map_on_failure_and_always(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
name: research
tasks:
  - {key: plan, kind: mock, action: plan}
  - key: search
    kind: mock
    action: search
    depends_on: plan
    map: {over: plan, path: result.queries}
    on_failure: continue
  - {key: summarize, kind: mock, action: sum, depends_on: search,
     onFailure: FAILURE_POLICY_FAIL_RUN}
  - {key: cleanup, kind: mock, action: clean, depends_on: [summarize], always: true}
""",
    )
    plan, search, summarize, cleanup = load(path).definition.tasks
    assert not plan.HasField("map") and not plan.always
    assert (search.map.over, search.map.path) == ("plan", "result.queries")
    assert search.on_failure == types_pb2.FAILURE_POLICY_CONTINUE
    assert summarize.on_failure == types_pb2.FAILURE_POLICY_FAIL_RUN
    assert cleanup.always


def test_what_workflow_get_writes_loads_back(tmp_path: Path) -> None:
    """`awp workflow get --json` spells the new fields as protobuf JSON."""
    definition = types_pb2.WorkflowDefinition(
        name="wf",
        version=2,
        tasks=[
            types_pb2.TaskDefinition(key="a", executor_kind="mock", action="x", input={}),
            types_pb2.TaskDefinition(
                key="b",
                executor_kind="mock",
                action="x",
                input={},
                depends_on=["a"],
                map=types_pb2.TaskMap(over="a", path="items"),
                on_failure=types_pb2.FAILURE_POLICY_CONTINUE,
            ),
            types_pb2.TaskDefinition(
                key="c", executor_kind="mock", action="x", input={}, depends_on=["b"], always=True
            ),
        ],
    )
    text = json.dumps({"definition": json_format.MessageToDict(definition)})
    assert load(write(tmp_path, text, "wf.json")).definition == definition


def test_bad_dynamic_fields_point_at_their_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """name: wf
tasks:
  - key: a
    kind: mock
    action: x
    map: {over: plan, paht: q}
    on_failure: sometimes
    always: "yes"
""",
    )
    found = problems(path)
    assert found[0].endswith("4 problems in the workflow file")
    assert f"{path}:6: tasks[0].map.paht: unknown field 'paht' (did you mean 'path'?)" in found
    assert f"{path}:6: tasks[0].map: missing path" in found
    assert (
        f"{path}:7: tasks[0].on_failure: expected one of fail_run, continue, got 'sometimes'"
        in found
    )
    assert f"{path}:8: tasks[0].always: expected true or false, got 'yes'" in found


CYCLE = """\
name: w
tasks:
  - {key: a, kind: mock, action: x, depends_on: [c]}
  - {key: b, kind: mock, action: x, depends_on: [a]}
  - key: c
    kind: mock
    action: x
    depends_on: [b]
"""


def test_the_servers_rules_are_checked_locally(tmp_path: Path) -> None:
    """A cycle is found by the kernel's own rule (through the SDK), before any call."""
    path = write(tmp_path, CYCLE)
    message, *found = problems(path)
    assert message == f"{path}: INVALID_DEFINITION: 1 problem in the workflow file"
    assert found == [f"{path}:3: tasks[0].depends_on: dependency cycle: a -> c -> b -> a"]


def test_apply_of_an_invalid_file_needs_no_server(tmp_path: Path) -> None:
    path = write(tmp_path, CYCLE)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    result = awp("workflow", "apply", str(path), "--address", address)
    assert result.code == Exit.USAGE, result.err
    assert "cannot reach" not in result.err
    assert "dependency cycle: a -> c -> b -> a" in result.err
    assert f"{path}:3: tasks[0].depends_on" in result.err
