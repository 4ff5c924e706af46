"""Workflow definitions as plain data -> awp.v1.WorkflowDefinition, and their local check.

The data is what a workflow file holds once parsed (YAML or JSON), and what a
code-defined Workflow turns itself into, so both paths give identical definitions. Every
key, with an example, is in docs/workflows.md ("The workflow file format").

Durations are "250ms", "1.5s", "2m", "1h30m" or a number of seconds (awp_common.durations).
The protobuf JSON names (`executorKind`, `dependsOn`, `backoffMultiplier`...) are accepted
too, and so is a whole GetWorkflow answer's workflow ({"definition": {...}}).

`definition` checks the shape (keys, types, durations, exact JSON values) and reports
every problem at once; `validate` then applies the server's own rules (names, limits,
dependencies, cycles) with the server's own function (awp_kernel.definition_proto).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

from google.protobuf import duration_pb2

from awp.v1 import types_pb2
from awp_common.durations import parse_duration
from awp_kernel import definition_proto
from awp_kernel.definition import DefinitionInvalid as RulesBroken
from awp_kernel.definition import FailurePolicy
from awp_protocol.errors import FieldViolation, Reason, join_violations
from awp_protocol.jsonvalue import JsonInvalid, to_struct
from awp_protocol.limits import MAX_PRIORITY, MIN_PRIORITY
from awp_sdk import placement
from awp_sdk.errors import DefinitionInvalid

Path_ = tuple[str | int, ...]
# A workflow definition as the SDK sends it: what a client holds without naming awp.v1.
Definition: TypeAlias = types_pb2.WorkflowDefinition

MAX_UINT32: Final = 2**32 - 1

# Other spellings of a key -> the name this format uses. Applied at every level: no
# spelling means two different things in two places.
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
    "concurrencyLimits": "concurrency_limits",
    "rateLimits": "rate_limits",
    **placement.ALIASES,
}
_WORKFLOW_KEYS: Final = ("name", "version", "description", "concurrency", "sticky", "tasks")
_TASK_KEYS: Final = (
    "key", "kind", "action", "input", "depends_on", "retry", "timeout", "map", "on_failure",
    "always", "concurrency_limits", "rate_limits", "wait", "priority", *placement.TASK_KEYS,
)  # fmt: skip
# A wait task's wait (docs/design.md §16): {sleep: DURATION} or {approval: PROMPT,
# timeout: DURATION, role: approver|admin}.
_WAIT_KEYS: Final = ("sleep", "approval", "timeout", "role")
_RETRY_KEYS: Final = ("max_attempts", "initial_backoff", "max_backoff", "multiplier")
_MAP_KEYS: Final = ("over", "path")
_LIMIT_KEYS: Final = ("key", "max")
_RATE_KEYS: Final = ("limit", "units")
# The failure policies by their short names (fail_run, continue), from the proto enum;
# its full names (FAILURE_POLICY_CONTINUE, as GetWorkflow's JSON writes them) work too.
_POLICY_PREFIX: Final = "FAILURE_POLICY_"
POLICIES: Final = {
    name.removeprefix(_POLICY_PREFIX).lower(): value
    for name, value in types_pb2.FailurePolicy.items()
    if value != types_pb2.FAILURE_POLICY_UNSPECIFIED
}
# A task's on_failure, as awp_sdk.workflow takes it: named here because the CLI, which
# imports that module, reaches the kernel only through this one.
OnFailure: TypeAlias = FailurePolicy
# A GetWorkflow answer's workflow wraps the definition; its other fields are ignored.
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


def to_duration(seconds: float) -> duration_pb2.Duration:
    message = duration_pb2.Duration()
    message.FromNanoseconds(round(seconds * 1e9))
    return message


def definition(data: Any) -> types_pb2.WorkflowDefinition:
    """The definition the data describes; DefinitionInvalid lists every shape problem, each
    violation's field a path into the data (e.g. "tasks[1].retry.max_attempts")."""
    problems: list[FieldViolation] = []
    data, root = unwrap(data)
    result = _definition(data, root, problems)
    if problems:
        count = len(problems)
        raise DefinitionInvalid(
            f"{count} problem{'s' if count > 1 else ''} in the workflow definition: "
            + join_violations(problems),
            reason=Reason.INVALID_DEFINITION,
            violations=problems,
        )
    return result


def unwrap(data: Any) -> tuple[Any, Path_]:
    """The definition inside a GetWorkflow answer's workflow, and the path to it."""
    if isinstance(data, Mapping) and "definition" in data and set(data) <= _WRAPPER_KEYS:
        return data["definition"], ("definition",)
    return data, ()


def validate(result: types_pb2.WorkflowDefinition) -> types_pb2.WorkflowDefinition:
    """The definition if the server's rules accept it, else DefinitionInvalid with the
    server's own violations (fields named as the server names them: definition.tasks[2].key)."""
    try:
        definition_proto.spec_from_proto(result)
    except RulesBroken as exc:
        raise DefinitionInvalid(
            str(exc), reason=Reason.INVALID_DEFINITION, violations=exc.violations
        ) from None
    return result


# ---------------------------------------------------------------- shape checks


def _add(problems: list[FieldViolation], path: Path_, description: str) -> None:
    problems.append(FieldViolation(render_path(path), description))


def _mapping(
    value: Any, path: Path_, allowed: tuple[str, ...], problems: list[FieldViolation]
) -> dict[str, Any] | None:
    """The mapping with canonical keys; unknown and repeated keys are reported."""
    if not isinstance(value, Mapping):
        _add(problems, path, f"expected a mapping, got {_type_name(value)}")
        return None
    result: dict[str, Any] = {}
    for raw_key, item in value.items():
        key = canonical_key(str(raw_key))
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _add(problems, (*path, str(raw_key)), f"unknown field {raw_key!r}{hint}")
        elif key in result:
            _add(problems, (*path, key), f"{raw_key!r} repeats a field given under another name")
        else:
            result[key] = item
    return result


def _record(
    value: Any,
    path: Path_,
    allowed: tuple[str, ...],
    required: tuple[str, ...],
    problems: list[FieldViolation],
) -> dict[str, Any] | None:
    """A mapping as _mapping reads it, with each required field that is missing reported."""
    fields = _mapping(value, path, allowed, problems)
    if fields is not None:
        for name in required:
            if name not in fields:
                _add(problems, path, f"missing {name}")
    return fields


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


def _string(fields: dict[str, Any], key: str, path: Path_, problems: list[FieldViolation]) -> str:
    value = fields.get(key, "")
    if isinstance(value, str):
        return value
    _add(problems, (*path, key), f"expected a string, got {_type_name(value)}")
    return ""


def _whole(
    fields: dict[str, Any], key: str, path: Path_, problems: list[FieldViolation], default: int = 0
) -> int:
    value = fields.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        _add(problems, (*path, key), f"expected a whole number, got {value!r}")
        return default
    if not 0 <= value <= MAX_UINT32:
        _add(problems, (*path, key), f"must be 0 to {MAX_UINT32}, got {value}")
        return default
    return value


def _definition(
    data: Any, root: Path_, problems: list[FieldViolation]
) -> types_pb2.WorkflowDefinition:
    result = types_pb2.WorkflowDefinition()
    if data is None:
        _add(problems, root, "the definition is empty")
        return result
    fields = _mapping(data, root, _WORKFLOW_KEYS, problems)
    if fields is None:
        return result
    result.name = _string(fields, "name", root, problems)
    if not result.name:
        _add(problems, (*root, "name"), "a workflow needs a name")
    # Version 1 unless told: a changed definition then fails loudly, asking for a new one.
    result.version = _whole(fields, "version", root, problems, default=1)
    result.description = _string(fields, "description", root, problems)
    result.concurrency = _whole(fields, "concurrency", root, problems)
    sticky = placement.workflow_sticky(fields, lambda at, what: _add(problems, at, what), root)
    tasks = fields.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        _add(problems, (*root, "tasks"), "expected a non-empty list of tasks")
        return result
    for index, task in enumerate(tasks):
        _task(task, (*root, "tasks", index), result.tasks.add(), problems, sticky)
    return result


def _task(
    data: Any,
    path: Path_,
    task: types_pb2.TaskDefinition,
    problems: list[FieldViolation],
    sticky: bool,
) -> None:
    fields = _mapping(data, path, _TASK_KEYS, problems)
    if fields is None:
        return
    # A wait task runs on no worker: it has no kind and no action.
    for required in ("key",) if "wait" in fields else ("key", "kind", "action"):
        if required not in fields:
            spelled = "kind (or executor_kind)" if required == "kind" else required
            _add(problems, path, f"missing {spelled}")
    task.key = _string(fields, "key", path, problems)
    if "kind" in fields:
        task.executor_kind = _string(fields, "kind", path, problems)
    if "action" in fields:
        task.action = _string(fields, "action", path, problems)
    if "wait" in fields:
        _wait(fields["wait"], (*path, "wait"), task.wait, problems)
    task_input = fields.get("input", {})
    if task_input is None:
        task_input = {}
    if not isinstance(task_input, Mapping):
        _add(
            problems,
            (*path, "input"),
            f"expected a mapping (JSON object), got {_type_name(task_input)}",
        )
    else:
        try:
            task.input.CopyFrom(to_struct(task_input, render_path((*path, "input"))))
        except JsonInvalid as exc:
            problems.append(FieldViolation(exc.where, exc.problem))
    depends_on = fields.get("depends_on", [])
    if isinstance(depends_on, str):
        depends_on = [depends_on]
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        _add(problems, (*path, "depends_on"), "expected a list of task keys")
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
        _add(problems, (*path, "always"), f"expected true or false, got {always!r}")
    limits = fields.get("concurrency_limits", [])
    if not isinstance(limits, list):
        _add(problems, (*path, "concurrency_limits"), "expected a list of {key, max}")
    else:
        for index, limit in enumerate(limits):
            _limit(limit, (*path, "concurrency_limits", index), task, problems)
    uses = fields.get("rate_limits", [])
    if not isinstance(uses, list):
        _add(problems, (*path, "rate_limits"), "expected a list of {limit, units}")
    else:
        for index, use in enumerate(uses):
            _rate(use, (*path, "rate_limits", index), task, problems)
    priority = fields.get("priority", 0)
    if isinstance(priority, int) and not isinstance(priority, bool):
        if MIN_PRIORITY <= priority <= MAX_PRIORITY:
            task.priority = priority
        else:
            _add(problems, (*path, "priority"), f"must be {MIN_PRIORITY} to {MAX_PRIORITY}")
    else:
        _add(problems, (*path, "priority"), f"expected an integer, got {priority!r}")
    placement.read(fields, path, task, lambda at, what: _add(problems, at, what), sticky=sticky)


def _rate(
    data: Any, path: Path_, task: types_pb2.TaskDefinition, problems: list[FieldViolation]
) -> None:
    fields = _record(data, path, _RATE_KEYS, ("limit",), problems)
    if fields is None:
        return
    units = fields.get("units", 1)
    if isinstance(units, int) and not isinstance(units, bool):
        units = str(units)
    if not isinstance(units, str):
        _add(problems, (*path, "units"), f"expected a number or text, got {_type_name(units)}")
        units = ""
    task.rate_limits.add(limit=_string(fields, "limit", path, problems), units=units)


def _limit(
    data: Any, path: Path_, task: types_pb2.TaskDefinition, problems: list[FieldViolation]
) -> None:
    fields = _record(data, path, _LIMIT_KEYS, _LIMIT_KEYS, problems)
    if fields is None:
        return
    task.concurrency_limits.add(
        key=_string(fields, "key", path, problems), max=_whole(fields, "max", path, problems)
    )


def _wait(
    data: Any, path: Path_, wait: types_pb2.WaitTaskDefinition, problems: list[FieldViolation]
) -> None:
    wait.SetInParent()
    fields = _mapping(data, path, _WAIT_KEYS, problems)
    if fields is None:
        return
    if ("sleep" in fields) == ("approval" in fields):
        _add(problems, path, "expected exactly one of sleep and approval")
        return
    if "sleep" in fields:
        wait.kind = types_pb2.CHECKPOINT_KIND_SLEEP
        seconds = _duration(fields["sleep"], (*path, "sleep"), problems)
        if seconds is not None:
            wait.sleep.CopyFrom(to_duration(seconds))
    else:
        wait.kind = types_pb2.CHECKPOINT_KIND_APPROVAL
        wait.prompt = _string(fields, "approval", path, problems)
    if "timeout" in fields:
        seconds = _duration(fields["timeout"], (*path, "timeout"), problems)
        if seconds is not None:
            wait.timeout.CopyFrom(to_duration(seconds))
    if "role" in fields:
        wait.role = _string(fields, "role", path, problems)


def _map(
    data: Any, path: Path_, task_map: types_pb2.TaskMap, problems: list[FieldViolation]
) -> None:
    task_map.SetInParent()
    fields = _record(data, path, _MAP_KEYS, _MAP_KEYS, problems)
    if fields is None:
        return
    task_map.over = _string(fields, "over", path, problems)
    task_map.path = _string(fields, "path", path, problems)


def _policy(
    value: Any, path: Path_, task: types_pb2.TaskDefinition, problems: list[FieldViolation]
) -> None:
    name = value.removeprefix(_POLICY_PREFIX).lower() if isinstance(value, str) else None
    if name in POLICIES:
        task.on_failure = POLICIES[name]
    else:
        _add(problems, path, f"expected one of {', '.join(POLICIES)}, got {value!r}")


def _retry(
    data: Any, path: Path_, retry: types_pb2.RetryPolicy, problems: list[FieldViolation]
) -> None:
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
        _add(problems, (*path, "multiplier"), f"expected a number, got {multiplier!r}")
    else:
        retry.backoff_multiplier = float(multiplier)


def _duration(value: Any, path: Path_, problems: list[FieldViolation]) -> float | None:
    try:
        return parse_duration(value)
    except ValueError as exc:
        _add(problems, path, str(exc))
        return None
