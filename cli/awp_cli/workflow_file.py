"""Workflow files: YAML or JSON holding a workflow definition as plain data (the format
awp_sdk.definitions describes, which a workflow in code turns into as well).

This module reads the file and says where in it each problem is: the SDK checks the
shape (keys, types, durations, exact JSON values), then the server's own rules (names,
limits, dependencies, cycles) locally, before any call; both, and the server should it
still refuse, name fields (tasks[2].retry.max_attempts) that are mapped back to lines of
the file here.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from awp.v1 import types_pb2
from awp_cli.errors import CliError, Exit, usage
from awp_sdk import definitions
from awp_sdk.definitions import Path_, canonical_key, parse_field, render_path
from awp_sdk.errors import DefinitionInvalid
from awp_sdk.workflow import Workflow

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


def load(path: Path) -> WorkflowFile:
    """Reads and checks a workflow file (shape, then the server's rules); every problem
    raises a usage CliError naming it and its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise usage(f"cannot read workflow file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise usage(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    data, line_of = _parse(path, text)
    if data is None:
        raise usage(f"{path}: the file is empty")
    _, root = definitions.unwrap(data)
    loaded = WorkflowFile(path, types_pb2.WorkflowDefinition(), lambda p: line_of((*root, *p)))
    try:
        definition = definitions.definition(data)
    except DefinitionInvalid as error:
        count = len(error.violations)
        raise usage(
            f"{path}: {count} problem{'s' if count > 1 else ''} in the workflow file",
            loaded.explain(error.violations),
        ) from None
    try:
        # The server's own rules (awp_kernel, through the SDK), before any call: a cycle or
        # an unknown dependency is the file's problem, whether or not a server is up.
        definitions.validate(definition)
    except DefinitionInvalid as error:
        count = len(error.violations)
        raise CliError(
            Exit.USAGE,
            f"{path}: {error.reason}: {count} problem{'s' if count > 1 else ''} "
            "in the workflow file",
            loaded.explain(error.violations),
            reason=error.reason,
        ) from None
    return WorkflowFile(path, definition, loaded.line_of)


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


# ---------------------------------------------------------------- workflows in code

# MODULE:ATTRIBUTE, e.g. my_app.flows:digest (the attribute may be dotted).
_CODE_REFERENCE: Final = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_code_reference(source: str) -> bool:
    """Whether `awp workflow apply SOURCE` names a workflow in code, not a file."""
    return bool(_CODE_REFERENCE.fullmatch(source)) and not Path(source).exists()


def from_code(reference: str) -> types_pb2.WorkflowDefinition:
    """The definition of the awp_sdk.Workflow at MODULE:ATTRIBUTE, checked with the server's
    rules; the working directory is importable, as for `python -m` and awp-worker."""
    module_name, _, attribute = reference.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise usage(f"{reference}: cannot import {module_name}: {exc}") from None
    except Exception as exc:
        raise usage(
            f"{reference}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise usage(f"{reference}: {module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, Workflow):
        raise usage(f"{reference} is a {type(found).__name__}, not an awp_sdk.Workflow")
    try:
        return found.definition()
    except DefinitionInvalid as error:
        count = len(error.violations)
        raise CliError(
            Exit.USAGE,
            f"{reference}: {error.reason}: {count} invalid field{'s' if count > 1 else ''}",
            violations=tuple(error.violations),
            reason=error.reason,
        ) from None
