"""Placement's vocabulary: labels, models and countable resources (docs/workflows.md
"Placement", docs/design.md §17).

A worker's labels are a set of "key=value" strings: one for each entry of its
RegisterRequest.labels and "model=<name>" for each model it advertises (so a key may
have several values). A task requires or prefers labels of the same form and reserves
units of named resources, each worker declaring its capacity of each. These checks are
shared by the worker (before it registers), the server (Register) and workflow
validation (CreateWorkflow, the SDK, the YAML loader).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from awp_protocol.errors import quote
from awp_protocol.limits import (
    MAX_LABEL_VALUE_CHARS,
    MAX_MODELS,
    MAX_RESOURCE_UNITS,
    MAX_RESOURCES,
    MAX_TASK_LABELS,
)

# A label's key, and a resource's name (also the key of RegisterRequest.labels).
LABEL_KEY_PATTERN: Final = re.compile(r"[A-Za-z0-9_./-]{1,63}")
# The label key a worker's models are advertised under.
MODEL_KEY: Final = "model"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
LABEL_SYNTAX: Final = (
    "key=value (key: 1-63 letters, digits, '_', '.', '/', '-'; value at most "
    f"{MAX_LABEL_VALUE_CHARS} characters, no control characters)"
)
RESOURCE_NAME_RULE: Final = "1-63 letters, digits, '_', '.', '/', '-'"
UNITS_RULE: Final = f"a whole number from 1 to {MAX_RESOURCE_UNITS:,}"


def label(key: str, value: str) -> str:
    return f"{key}={value}"


def label_problem(text: str) -> str | None:
    """Why `text` is not a placement label "key=value" (None: it is one)."""
    key, sep, value = text.partition("=")
    if not sep or not LABEL_KEY_PATTERN.fullmatch(key):
        return f"{quote(text)} is not {LABEL_SYNTAX}"
    if len(value) > MAX_LABEL_VALUE_CHARS or _CONTROL.search(value):
        return f"{quote(text)} is not {LABEL_SYNTAX}"
    return None


def model_problem(name: str) -> str | None:
    """Why `name` cannot be advertised as a model (None: it can)."""
    if not 1 <= len(name) <= MAX_LABEL_VALUE_CHARS or "=" in name or _CONTROL.search(name):
        return (
            f"{quote(name)} is not a model name (1-{MAX_LABEL_VALUE_CHARS} characters, "
            "no '=' or control characters)"
        )
    return None


def resources_problems(resources: Mapping[str, int], what: str) -> list[tuple[str, str]]:
    """(field, description) for each bad entry of a resources map; `what` says what the
    units are ("capacity" of a worker, "units" a task reserves)."""
    if len(resources) > MAX_RESOURCES:
        return [("resources", f"at most {MAX_RESOURCES} resources, got {len(resources)}")]
    found: list[tuple[str, str]] = []
    for name, units in resources.items():
        where, it = f"resources[{quote(name)}]", f"resource {quote(name)}"
        if not LABEL_KEY_PATTERN.fullmatch(name):
            found.append((where, f"{it}: a resource name is {RESOURCE_NAME_RULE}"))
        elif isinstance(units, bool) or not isinstance(units, int):
            found.append((where, f"{it}: {what} must be {UNITS_RULE}, got {units!r}"))
        elif not 1 <= units <= MAX_RESOURCE_UNITS:
            found.append((where, f"{it}: {what} must be {UNITS_RULE}, got {units}"))
    return found


def labels_problems(labels: Sequence[str], field: str) -> list[tuple[str, str]]:
    """(field, description) for each bad label of a task's required or preferred list."""
    if len(labels) > MAX_TASK_LABELS:
        return [(field, f"at most {MAX_TASK_LABELS} labels, got {len(labels)}")]
    found: list[tuple[str, str]] = []
    for index, text in enumerate(labels):
        problem = label_problem(text)
        if problem is not None:
            found.append((f"{field}[{index}]", problem))
    if len(set(labels)) != len(labels):
        found.append((field, "lists a label twice"))
    return found


def models_problems(models: Sequence[str]) -> list[tuple[str, str]]:
    if len(models) > MAX_MODELS:
        return [("models", f"at most {MAX_MODELS} models, got {len(models)}")]
    found: list[tuple[str, str]] = []
    for index, name in enumerate(models):
        problem = model_problem(name)
        if problem is not None:
            found.append((f"models[{index}]", problem))
    return found


def worker_labels(labels: Mapping[str, str], models: Iterable[str]) -> tuple[str, ...]:
    """A worker's placement labels: its labels as "key=value" and its models as
    "model=<name>", sorted, each once."""
    found = {label(key, value) for key, value in labels.items()}
    found.update(label(MODEL_KEY, model) for model in models)
    return tuple(sorted(found))
