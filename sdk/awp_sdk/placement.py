"""A workflow file's placement keys (docs/workflows.md "Placement"): a task's
`required_labels`, `preferred_labels`, `resources` and `sticky`, and the workflow's
`sticky` (the default of each of its tasks). Shapes only; the rules (label syntax,
units 1 to 1,000,000) are the server's own, applied by definitions.validate and named
by task."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from awp.v1 import types_pb2

Path_ = tuple[str | int, ...]
TASK_KEYS: Final = ("required_labels", "preferred_labels", "resources", "sticky")
ALIASES: Final = {"requiredLabels": "required_labels", "preferredLabels": "preferred_labels"}
_INT64: Final = 2**63


def read(
    fields: Mapping[str, Any],
    path: Path_,
    task: types_pb2.TaskDefinition,
    add: Callable[[Path_, str], None],
    *,
    sticky: bool,
) -> None:
    """Fills the task's placement from its fields; `sticky`: the workflow's default."""
    for key, target in (
        ("required_labels", task.required_labels),
        ("preferred_labels", task.preferred_labels),
    ):
        labels = fields.get(key, [])
        if isinstance(labels, str):
            labels = [labels]
        if not isinstance(labels, list) or not all(isinstance(text, str) for text in labels):
            add((*path, key), "expected a list of key=value labels, e.g. [gpu=a100]")
        else:
            target.extend(labels)
    resources = fields.get("resources") or {}
    if not isinstance(resources, Mapping):
        add((*path, "resources"), "expected a mapping of resource to units, e.g. {gpu: 1}")
        resources = {}
    for name, units in resources.items():
        if isinstance(units, bool) or not isinstance(units, int) or not -_INT64 < units < _INT64:
            add((*path, "resources", str(name)), f"expected a whole number of units, got {units!r}")
        else:
            task.resources[str(name)] = units
    own = fields.get("sticky", sticky)
    if isinstance(own, bool):
        task.sticky = own
    else:
        add((*path, "sticky"), f"expected true or false, got {own!r}")


def workflow_sticky(
    fields: Mapping[str, Any], add: Callable[[Path_, str], None], root: Path_
) -> bool:
    sticky = fields.get("sticky", False)
    if not isinstance(sticky, bool):
        add((*root, "sticky"), f"expected true or false, got {sticky!r}")
        return False
    return sticky
