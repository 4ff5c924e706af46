"""Workflow files: a readable YAML or JSON form of awp.v1.WorkflowDefinition.

    name: research-digest
    version: 1
    concurrency: 4
    tasks:
      - key: fetch
        kind: mock                 # or executor_kind
        action: fetch.news
        input: {sleep_ms: 200}
        retry: {max_attempts: 3, initial_backoff: 250ms, max_backoff: 30s, multiplier: 2}
        timeout: 30s
      - key: summarize
        kind: python
        action: demo.summarize
        depends_on: [fetch]
        on_failure: continue       # or fail_run (the default)
      - key: search
        kind: python
        action: demo.search
        depends_on: [plan]
        map: {over: plan, path: queries}   # once per element of plan's output["queries"]
      - key: cleanup
        kind: python
        action: demo.cleanup
        always: true               # runs once the rest has ended, success or failure

Durations are "250ms", "1.5s", "2m", "1h30m" or a number of seconds (awp_common.durations,
the parser every duration flag uses too). The protobuf JSON
names (`executorKind`, `dependsOn`, `backoffMultiplier`...) are accepted too, and so is
a whole `awp workflow get --json` answer, so a stored workflow can be edited and
re-applied under a new version.

This module checks only the shape (keys, types, durations); the server checks the
rules (names, limits, dependencies, cycles) and its field violations are mapped back
to lines of the file here.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from google.protobuf import duration_pb2, struct_pb2

from awp.v1 import types_pb2
from awp_cli.errors import usage
from awp_common.durations import parse_duration

Path_ = tuple[str | int, ...]

MAX_UINT32: Final = 2**32 - 1

# Other spellings of a key -> the name this file format uses. Applied at every level:
# no spelling means two different things in two places.
_ALIASES: Final = {
    "executor_kind": "kind",
    "executorKind": "kind",
    "dependsOn": "depends_on",
    "maxAttempts": "max_attempts",
    "initialBackoff": "initial_backoff",
    "maxBackoff": "max_backoff",
    "backoff_multiplier": "multiplier",
    "backoffMultiplier": "multiplier",
    "onFailure": "on_failure",
}
_WORKFLOW_KEYS: Final = ("name", "version", "description", "concurrency", "tasks")
_TASK_KEYS: Final = (
    "key",
    "kind",
    "action",
    "input",
    "depends_on",
    "retry",
    "timeout",
    "map",
    "on_failure",
    "always",
)
_RETRY_KEYS: Final = ("max_attempts", "initial_backoff", "max_backoff", "multiplier")
_MAP_KEYS: Final = ("over", "path")
# The failure policies by their short names (fail_run, continue), from the proto enum;
# its full names (FAILURE_POLICY_CONTINUE, as `awp workflow get --json` writes them) work too.
_POLICY_PREFIX: Final = "FAILURE_POLICY_"
_POLICIES: Final = {
    name.removeprefix(_POLICY_PREFIX).lower(): value
    for name, value in types_pb2.FailurePolicy.items()
    if value != types_pb2.FAILURE_POLICY_UNSPECIFIED
}
# A `awp workflow get --json` answer wraps the definition; its other fields are ignored.
_WRAPPER_KEYS: Final = frozenset({"definition", "createdAt", "created_at"})


def canonical_key(key: str) -> str:
    return _ALIASES.get(key, key)


def render_path(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "(top level)"


_FIELD_PART: Final = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_field(field: str) -> Path_:
    """'definition.tasks[2].retry.backoff_multiplier' -> ('tasks', 2, 'retry', 'multiplier')."""
    parts: list[str | int] = []
    for name, index in _FIELD_PART.findall(field):
        parts.append(int(index) if index else canonical_key(name))
    if parts[:1] == ["definition"]:
        parts = parts[1:]
    return tuple(parts)


# ---------------------------------------------------------------- durations


def to_duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class WorkflowFile:
    """A parsed file: the definition, and where in the file a field was written."""

    path: Path
    definition: types_pb2.WorkflowDefinition
    line_of: Callable[[Path_], int | None]

    def where(self, field_path: Path_) -> str:
        line = self.line_of(field_path)
        return f"{self.path}:{line}" if line else str(self.path)

    def explain(self, violations: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
        """Server field violations as 'FILE:LINE: field: problem' lines."""
        lines = []
        for field, description in violations:
            path = parse_field(field)
            lines.append(f"{self.where(path)}: {render_path(path)}: {description}")
        return tuple(lines)


class _Problems:
    """Collects every shape problem of a file, so one apply reports them all."""

    def __init__(self, source: Path, line_of: Callable[[Path_], int | None]) -> None:
        self.source = source
        self.line_of = line_of
        self.found: list[str] = []

    def add(self, path: Path_, problem: str) -> None:
        line = self.line_of(path)
        where = f"{self.source}:{line}" if line else str(self.source)
        self.found.append(f"{where}: {render_path(path)}: {problem}")


def load(path: Path) -> WorkflowFile:
    """Reads and checks a workflow file; every problem raises a usage CliError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise usage(f"cannot read workflow file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise usage(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    data, line_of = _parse(path, text)
    problems = _Problems(path, line_of)
    root: Path_ = ()
    if isinstance(data, Mapping) and "definition" in data and set(data) <= _WRAPPER_KEYS:
        data, root = data["definition"], ("definition",)
    definition = _definition(data, root, problems)
    if problems.found:
        count = len(problems.found)
        raise usage(
            f"{path}: {count} problem{'s' if count > 1 else ''} in the workflow file",
            tuple(problems.found),
        )
    return WorkflowFile(path, definition, lambda p: line_of((*root, *p)))


def _parse(path: Path, text: str) -> tuple[Any, Callable[[Path_], int | None]]:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text), lambda _path: None
        except json.JSONDecodeError as exc:
            raise usage(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else f"{path}"
        raise usage(f"{where}: invalid YAML: {_flat(problem)}") from None
    return data, lambda field_path: _line(node, field_path)


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def _line(node: yaml.Node | None, path: Path_) -> int | None:
    """1-based line of the deepest node along path (the field, or the nearest parent)."""
    if node is None:
        return None
    line: int = node.start_mark.line + 1
    for part in path:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key.value, str) and canonical_key(key.value) == part:
                    child = value
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


# ---------------------------------------------------------------- shape checks


def _mapping(
    value: Any, path: Path_, allowed: tuple[str, ...], problems: _Problems
) -> dict[str, Any] | None:
    """The mapping with canonical keys; unknown and repeated keys are reported."""
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping, got {_type_name(value)}")
        return None
    result: dict[str, Any] = {}
    for raw_key, item in value.items():
        key = canonical_key(str(raw_key))
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.add((*path, str(raw_key)), f"unknown field {raw_key!r}{hint}")
        elif key in result:
            problems.add((*path, key), f"{raw_key!r} repeats a field given under another name")
        else:
            result[key] = item
    return result


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _string(fields: dict[str, Any], key: str, path: Path_, problems: _Problems) -> str:
    value = fields.get(key, "")
    if isinstance(value, str):
        return value
    problems.add((*path, key), f"expected a string, got {_type_name(value)}")
    return ""


def _whole(
    fields: dict[str, Any], key: str, path: Path_, problems: _Problems, default: int = 0
) -> int:
    value = fields.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        problems.add((*path, key), f"expected a whole number, got {value!r}")
        return default
    if not 0 <= value <= MAX_UINT32:
        problems.add((*path, key), f"must be 0 to {MAX_UINT32}, got {value}")
        return default
    return value


def _json_value(value: Any, path: Path_, problems: _Problems) -> bool:
    """True when value is plain JSON (YAML also has dates, sets, non-string keys...)."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        if math.isfinite(value):
            return True
        problems.add(path, f"{value} is not a JSON number")
        return False
    if isinstance(value, list):
        return all(_json_value(item, (*path, i), problems) for i, item in enumerate(value))
    if isinstance(value, Mapping):
        ok = True
        for key, item in value.items():
            if not isinstance(key, str):
                problems.add(path, f"key {key!r} is not a string (quote it)")
                ok = False
            elif not _json_value(item, (*path, key), problems):
                ok = False
        return ok
    problems.add(path, f"{_type_name(value)} is not a JSON value (quote it)")
    return False


def _definition(data: Any, root: Path_, problems: _Problems) -> types_pb2.WorkflowDefinition:
    definition = types_pb2.WorkflowDefinition()
    if data is None:
        problems.add(root, "the file is empty")
        return definition
    fields = _mapping(data, root, _WORKFLOW_KEYS, problems)
    if fields is None:
        return definition
    definition.name = _string(fields, "name", root, problems)
    if not definition.name:
        problems.add((*root, "name"), "a workflow needs a name")
    # Version 1 unless told: a changed definition then fails loudly, asking for a new one.
    definition.version = _whole(fields, "version", root, problems, default=1)
    definition.description = _string(fields, "description", root, problems)
    definition.concurrency = _whole(fields, "concurrency", root, problems)
    tasks = fields.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        problems.add((*root, "tasks"), "expected a non-empty list of tasks")
        return definition
    for index, task in enumerate(tasks):
        _task(task, (*root, "tasks", index), definition.tasks.add(), problems)
    return definition


def _task(data: Any, path: Path_, task: types_pb2.TaskDefinition, problems: _Problems) -> None:
    fields = _mapping(data, path, _TASK_KEYS, problems)
    if fields is None:
        return
    for required in ("key", "kind", "action"):
        if required not in fields:
            spelled = "kind (or executor_kind)" if required == "kind" else required
            problems.add(path, f"missing {spelled}")
    task.key = _string(fields, "key", path, problems)
    task.executor_kind = _string(fields, "kind", path, problems)
    task.action = _string(fields, "action", path, problems)
    task_input = fields.get("input", {})
    if task_input is None:
        task_input = {}
    if not isinstance(task_input, Mapping):
        problems.add(
            (*path, "input"), f"expected a mapping (JSON object), got {_type_name(task_input)}"
        )
    elif _json_value(task_input, (*path, "input"), problems):
        struct = struct_pb2.Struct()
        struct.update(task_input)
        task.input.CopyFrom(struct)
    depends_on = fields.get("depends_on", [])
    if isinstance(depends_on, str):
        depends_on = [depends_on]
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        problems.add((*path, "depends_on"), "expected a list of task keys")
    else:
        task.depends_on.extend(depends_on)
    if "retry" in fields:
        _retry(fields["retry"], (*path, "retry"), task.retry, problems)
    if "timeout" in fields:
        seconds = _duration(fields["timeout"], (*path, "timeout"), problems)
        if seconds is not None:
            task.timeout.CopyFrom(to_duration(seconds))
    if fields.get("map") is not None:
        _map(fields["map"], (*path, "map"), task.map, problems)
    if "on_failure" in fields:
        _policy(fields["on_failure"], (*path, "on_failure"), task, problems)
    always = fields.get("always", False)
    if isinstance(always, bool):
        task.always = always
    else:
        problems.add((*path, "always"), f"expected true or false, got {always!r}")


def _map(data: Any, path: Path_, task_map: types_pb2.TaskMap, problems: _Problems) -> None:
    task_map.SetInParent()
    fields = _mapping(data, path, _MAP_KEYS, problems)
    if fields is None:
        return
    for required in _MAP_KEYS:
        if required not in fields:
            problems.add(path, f"missing {required}")
    task_map.over = _string(fields, "over", path, problems)
    task_map.path = _string(fields, "path", path, problems)


def _policy(value: Any, path: Path_, task: types_pb2.TaskDefinition, problems: _Problems) -> None:
    name = value.removeprefix(_POLICY_PREFIX).lower() if isinstance(value, str) else None
    if name in _POLICIES:
        task.on_failure = _POLICIES[name]
    else:
        problems.add(path, f"expected one of {', '.join(_POLICIES)}, got {value!r}")


def _retry(data: Any, path: Path_, retry: types_pb2.RetryPolicy, problems: _Problems) -> None:
    retry.SetInParent()
    fields = _mapping(data, path, _RETRY_KEYS, problems)
    if fields is None:
        return
    retry.max_attempts = _whole(fields, "max_attempts", path, problems)
    for key, target in (
        ("initial_backoff", retry.initial_backoff),
        ("max_backoff", retry.max_backoff),
    ):
        if key in fields:
            seconds = _duration(fields[key], (*path, key), problems)
            if seconds is not None:
                target.CopyFrom(to_duration(seconds))
    multiplier = fields.get("multiplier", 0)
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
        problems.add((*path, "multiplier"), f"expected a number, got {multiplier!r}")
    else:
        retry.backoff_multiplier = float(multiplier)


def _duration(value: Any, path: Path_, problems: _Problems) -> float | None:
    try:
        return parse_duration(value)
    except ValueError as exc:
        problems.add(path, str(exc))
        return None
