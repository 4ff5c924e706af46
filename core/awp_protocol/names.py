"""The name patterns of the protocol, and the checks of what a worker declares at Register.

Patterns are used with fullmatch: '$' would also accept a trailing newline.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from awp_protocol.errors import FieldsInvalid, FieldViolation, quote
from awp_protocol.limits import (
    MAX_CHECKPOINT_NAME_CHARS,
    MAX_EXECUTOR_KINDS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_WORKER_CONCURRENCY,
    MAX_WORKER_NAME_CHARS,
)
from awp_protocol.placement import LABEL_KEY_PATTERN, models_problems, resources_problems

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # a workflow's name
TASK_KEY_PATTERN: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# An identifier an executor resolves: never a path, URL or shell command.
ACTION_PATTERN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
EXECUTOR_KIND_PATTERN: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# A step's, a signal's or an approval's name (docs/design.md §16).
CHECKPOINT_NAME_PATTERN: Final = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_CHECKPOINT_NAME_CHARS}}}")
# Where a map task finds its list in its upstream's output: object keys (or, for a list
# on the way, an index) joined by dots, e.g. "queries" or "result.items".
MAP_PATH_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")

NAME_RULE: Final = "1-128 characters of letters, digits, '_', '.', '-'"
TASK_KEY_RULE: Final = "1-64 characters of letters, digits, '_', '.', '-'"
ACTION_RULE: Final = (
    "an identifier like 'reports.summarize' (letters, digits, '_', '.', ':', '-'; "
    "no paths, URLs or commands)"
)
CHECKPOINT_NAME_RULE: Final = (
    f"1-{MAX_CHECKPOINT_NAME_CHARS} characters of letters, digits, '_', '.', ':', '-'"
)
EXECUTOR_KIND_RULE: Final = "1-32 characters: a lower-case letter, then a-z, 0-9, '_' or '-'"
MAP_PATH_RULE: Final = (
    "keys of the upstream's output joined by '.', e.g. 'queries' or 'result.items' "
    "(letters, digits, '_', '-'; a number indexes a list)"
)
LABEL_RULE: Final = (
    f"keys: 1-63 characters of letters, digits, '_', '.', '/', '-'; "
    f"values at most {MAX_LABEL_VALUE_CHARS} characters"
)


def element_key(map_key: str, index: int) -> str:
    """The task key of element `index` of map task `map_key`: 'search[3]'. Brackets are
    not allowed in a task key, so no element key can be a declared task's."""
    return f"{map_key}[{index}]"


def idempotency_key(run_id: object, task_key: str) -> str:
    """A task's idempotency key, "<run_id>/<task_key>" (Lease.idempotency_key): the same
    for every attempt of the task, so that an action can make its side effects once."""
    return f"{run_id}/{task_key}"


class RegisterInvalid(FieldsInvalid):
    """A Register the server refuses. Its message names each field as the caller calls it."""

    def __init__(self, violations: Sequence[FieldViolation], settings: Mapping[str, str]) -> None:
        super().__init__(violations)
        # The message names the caller's own settings (a worker's flags); the violations
        # keep the request's field names for the wire.
        self.args = (
            "; ".join(
                f"{settings.get(v.field.partition('[')[0], v.field)}: {v.description}"
                for v in violations
            ),
        )


def check_register(
    name: str,
    executor_kinds: Sequence[str],
    max_concurrency: int,
    labels: Mapping[str, str],
    *,
    models: Sequence[str] = (),
    resources: Mapping[str, int] | None = None,
    settings: Mapping[str, str] | None = None,
) -> None:
    """Raises RegisterInvalid listing every field of this RegisterRequest the server refuses.

    `settings` maps a request field (name, executor_kinds, max_concurrency, labels,
    models, resources) to what the caller calls it, so that a worker's start-up error
    names the flag to fix.
    """
    found: list[FieldViolation] = []
    if not 1 <= len(name) <= MAX_WORKER_NAME_CHARS:
        found.append(
            FieldViolation(
                "name", f"must be 1 to {MAX_WORKER_NAME_CHARS} characters, got {len(name)}"
            )
        )
    if not executor_kinds:
        found.append(FieldViolation("executor_kinds", "at least one executor kind is required"))
    if len(executor_kinds) > MAX_EXECUTOR_KINDS:
        found.append(
            FieldViolation(
                "executor_kinds",
                f"at most {MAX_EXECUTOR_KINDS} executor kinds, got {len(executor_kinds)}",
            )
        )
        executor_kinds = ()  # not worth walking to report more
    for index, kind in enumerate(executor_kinds):
        if not EXECUTOR_KIND_PATTERN.fullmatch(kind):
            found.append(
                FieldViolation(
                    f"executor_kinds[{index}]",
                    f"{quote(kind)} is not an executor kind name ({EXECUTOR_KIND_RULE})",
                )
            )
    if len(set(executor_kinds)) != len(executor_kinds):
        found.append(FieldViolation("executor_kinds", "lists a kind twice"))
    if not 1 <= max_concurrency <= MAX_WORKER_CONCURRENCY:
        found.append(
            FieldViolation(
                "max_concurrency", f"must be 1 to {MAX_WORKER_CONCURRENCY}, got {max_concurrency}"
            )
        )
    if len(labels) > MAX_LABELS:
        found.append(FieldViolation("labels", f"at most {MAX_LABELS} labels, got {len(labels)}"))
        labels = {}  # not worth walking to report more
    for key, value in labels.items():
        if not LABEL_KEY_PATTERN.fullmatch(key) or len(value) > MAX_LABEL_VALUE_CHARS:
            found.append(
                FieldViolation(f"labels[{quote(key)}]", f"label {quote(key)}: {LABEL_RULE}")
            )
    for field, description in models_problems(models) + resources_problems(
        resources or {}, "capacity"
    ):
        found.append(FieldViolation(field, description))
    if found:
        raise RegisterInvalid(found, settings or {})
