"""Workflow definitions: the immutable DAG a run executes, and its validation."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from awp_kernel import concurrency, placement, ratelimits
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.placement import Placement
from awp_kernel.ratelimits import RateUse
from awp_kernel.retry import RetryPolicy
from awp_kernel.wait_tasks import WaitTaskSpec, wait_violations
from awp_protocol.errors import FieldsInvalid, FieldViolation, Reason, quote
from awp_protocol.jsonvalue import canonical_json, json_size
from awp_protocol.limits import (
    DEFAULT_TIMEOUT_MS,
    MAX_ATTEMPTS,
    MAX_BACKOFF_MULTIPLIER,
    MAX_CONCURRENCY,
    MAX_DESCRIPTION_CHARS,
    MAX_DURATION_MS,
    MAX_INPUT_BYTES,
    MAX_MAP_PATH_CHARS,
    MAX_PRIORITY,
    MAX_TASKS,
    MAX_VERSION,
    MIN_PRIORITY,
    MIN_TIMEOUT_MS,
)
from awp_protocol.names import (
    ACTION_PATTERN,
    ACTION_RULE,
    MAP_PATH_PATTERN,
    MAP_PATH_RULE,
    NAME_PATTERN,
    NAME_RULE,
    TASK_KEY_PATTERN,
    TASK_KEY_RULE,
)

KNOWN_EXECUTOR_KINDS: Final[frozenset[str]] = frozenset({"mock", "python"})
_CYCLE_KEYS_SHOWN: Final = 8

# What a task's permanent failure does to its run: "fail_run" stops it (untouched tasks
# skipped, live leases revoked); "continue" skips only the tasks downstream of it and lets
# the rest run (the run still ends failed).
FailurePolicy = Literal["fail_run", "continue"]
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = get_args(FailurePolicy)
# Each element of a map task gets the task's input with these two keys added.
MAP_ITEM_KEY: Final = "item"
MAP_INDEX_KEY: Final = "index"


class DefinitionInvalid(FieldsInvalid):
    """Raised with every violation found, each naming the offending field."""

    reason = Reason.INVALID_DEFINITION


@dataclass(frozen=True, slots=True)
class MapSpec:
    """Run a task once per element of the list at `path` in the output of task `over`
    (one of its dependencies)."""

    over: str
    path: str

    def keys(self) -> list[str]:
        """The path's steps: object keys, or indexes of a list on the way."""
        return self.path.split(".")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of a workflow: the one model every way of writing a workflow produces.

    map: run once per element of an upstream list (each element its own task instance
    with its own attempts; retry and timeout apply per element). on_failure: what a
    permanent failure does to the run. always: run once every other task is terminal,
    whether the run is succeeding or failing (not when it is canceled); its dependencies
    only order it, and its own failure does not change the run's outcome.
    """

    key: str
    executor_kind: str
    action: str
    input: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    map: MapSpec | None = None
    on_failure: FailurePolicy = "fail_run"
    always: bool = False
    # Keyed limits (awp_kernel.concurrency): every lease of this task holds each key.
    concurrency_limits: tuple[ConcurrencyLimit, ...] = ()
    # Named rate limits each execution charges (awp_kernel.ratelimits).
    rate_limits: tuple[RateUse, ...] = ()
    # A wait task (awp_kernel.wait_tasks): no executor_kind, no action.
    wait: WaitTaskSpec | None = None
    # Added to its run's priority: its base priority in the grant (awp_db.grant).
    priority: int = 0
    # Labels, resources, stickiness (awp_kernel.placement).
    placement: Placement = Placement()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "key": self.key,
            "executor_kind": self.executor_kind,
            "action": self.action,
            "input": dict(self.input),
            "depends_on": list(self.depends_on),
            "retry": {
                "max_attempts": self.retry.max_attempts,
                "initial_backoff_ms": self.retry.initial_backoff_ms,
                "max_backoff_ms": self.retry.max_backoff_ms,
                "multiplier": self.retry.multiplier,
            },
            "timeout_ms": self.timeout_ms,
        }
        # Written only when not the default, so every definition stored before these
        # fields existed keeps its exact JSON and hash.
        if self.map is not None:
            data["map"] = {"over": self.map.over, "path": self.map.path}
        if self.on_failure != "fail_run":
            data["on_failure"] = self.on_failure
        if self.always:
            data["always"] = True
        if self.concurrency_limits:
            data["concurrency_limits"] = [limit.to_json() for limit in self.concurrency_limits]
        if self.rate_limits:
            data["rate_limits"] = [use.to_json() for use in self.rate_limits]
        if self.wait is not None:
            data["wait"] = self.wait.to_json()
        if self.priority:
            data["priority"] = self.priority
        data.update(self.placement.to_json())
        return data

    @classmethod
    def from_json(cls, t: Mapping[str, Any]) -> TaskSpec:
        mapped = t.get("map")
        return cls(
            key=t["key"],
            executor_kind=t["executor_kind"],
            action=t["action"],
            input=t.get("input", {}),
            depends_on=tuple(t.get("depends_on", ())),
            retry=RetryPolicy(
                max_attempts=t["retry"]["max_attempts"],
                initial_backoff_ms=t["retry"]["initial_backoff_ms"],
                max_backoff_ms=t["retry"]["max_backoff_ms"],
                multiplier=t["retry"]["multiplier"],
            ),
            timeout_ms=t["timeout_ms"],
            map=None if mapped is None else MapSpec(mapped["over"], mapped["path"]),
            on_failure=t.get("on_failure", "fail_run"),
            always=t.get("always", False),
            concurrency_limits=tuple(
                ConcurrencyLimit.from_json(limit) for limit in t.get("concurrency_limits", ())
            ),
            rate_limits=tuple(RateUse.from_json(use) for use in t.get("rate_limits", ())),
            wait=WaitTaskSpec.from_json(t["wait"]) if "wait" in t else None,
            priority=t.get("priority", 0),
            placement=Placement.from_json(t),
        )


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    name: str
    version: int
    tasks: tuple[TaskSpec, ...]
    description: str = ""
    concurrency: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "concurrency": self.concurrency,
            "tasks": [t.to_json() for t in self.tasks],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkflowSpec:
        return cls(
            name=data["name"],
            version=data["version"],
            description=data.get("description", ""),
            concurrency=data.get("concurrency", 0),
            tasks=tuple(TaskSpec.from_json(t) for t in data["tasks"]),
        )

    def definition_hash(self) -> bytes:
        return hashlib.sha256(canonical_json(self.to_json())).digest()

    def dependents(self) -> dict[str, list[str]]:
        """Reverse edges: for each task, the tasks its success unlocks. An `always` task
        is not among them: it waits for the end of the run, not for its dependencies'
        success (awp_db.dynamic releases it)."""
        reverse: dict[str, list[str]] = {t.key: [] for t in self.tasks}
        for task in self.tasks:
            if task.always:
                continue
            for dependency in task.depends_on:
                reverse[dependency].append(task.key)
        return reverse


def validate(
    spec: WorkflowSpec, known_kinds: frozenset[str] = KNOWN_EXECUTOR_KINDS
) -> WorkflowSpec:
    """Returns the spec if it is a valid workflow, else raises DefinitionInvalid."""
    violations: list[FieldViolation] = []

    def bad(field_name: str, description: str) -> None:
        violations.append(FieldViolation(field_name, description))

    if not NAME_PATTERN.fullmatch(spec.name):
        bad("definition.name", f"must be {NAME_RULE}")
    if not 1 <= spec.version <= MAX_VERSION:
        bad("definition.version", f"must be 1 to {MAX_VERSION}")
    if len(spec.description) > MAX_DESCRIPTION_CHARS:
        bad("definition.description", f"must be at most {MAX_DESCRIPTION_CHARS} characters")
    if not 0 <= spec.concurrency <= MAX_CONCURRENCY:
        bad("definition.concurrency", f"must be 0 (unlimited) to {MAX_CONCURRENCY}")
    if not spec.tasks:
        bad("definition.tasks", "a workflow needs at least one task")
    if len(spec.tasks) > MAX_TASKS:
        bad("definition.tasks", f"at most {MAX_TASKS} tasks, got {len(spec.tasks)}")

    first_index: dict[str, int] = {}
    for index, task in enumerate(spec.tasks):
        if task.key in first_index:
            bad(
                f"definition.tasks[{index}].key",
                f"duplicate key {quote(task.key)} (also tasks[{first_index[task.key]}])",
            )
        else:
            first_index[task.key] = index

    for index, task in enumerate(spec.tasks):
        violations.extend(_task_violations(f"definition.tasks[{index}]", task, known_kinds))
        seen: set[str] = set()
        for dep_index, dependency in enumerate(task.depends_on):
            where = f"definition.tasks[{index}].depends_on[{dep_index}]"
            if dependency == task.key:
                bad(where, f"task {quote(task.key)} depends on itself")
            elif dependency not in first_index:
                bad(where, f"unknown task {quote(dependency)}")
            elif dependency in seen:
                bad(where, f"{quote(dependency)} is listed twice")
            seen.add(dependency)

    violations.extend(_dynamic_violations(spec, first_index))
    if not violations:
        cycle = find_cycle(spec.tasks)
        if cycle is not None:
            bad(
                f"definition.tasks[{first_index[cycle[0]]}].depends_on",
                "dependency cycle: " + _cycle_text(cycle),
            )
    if violations:
        raise DefinitionInvalid(violations)
    return spec


def _task_violations(
    where: str, task: TaskSpec, known_kinds: frozenset[str]
) -> list[FieldViolation]:
    found: list[FieldViolation] = []

    def bad(field_name: str, description: str) -> None:
        found.append(FieldViolation(f"{where}.{field_name}", description))

    if not TASK_KEY_PATTERN.fullmatch(task.key):
        bad("key", f"must be {TASK_KEY_RULE}")
    if task.wait is not None:
        found.extend(wait_violations(where, task.wait))
        if task.executor_kind or task.action:
            bad("wait", "a wait task runs on no worker: leave executor_kind and action empty")
        if task.map is not None or task.always:
            bad("wait", "a wait task cannot be a map task or an always task")
        if task.placement:
            bad("wait", "a wait task runs on no worker: it has no labels, resources or sticky")
    elif task.executor_kind not in known_kinds:
        bad(
            "executor_kind",
            f"unknown executor kind {quote(task.executor_kind)}; known: "
            + ", ".join(sorted(known_kinds)),
        )
    if task.wait is None and not ACTION_PATTERN.fullmatch(task.action):
        bad("action", f"must be {ACTION_RULE}")
    try:
        # Strict JSON: NaN/Infinity, non-string keys or unencodable text cannot be stored.
        size = json_size(dict(task.input))
    except (TypeError, ValueError):
        bad("input", "must be a JSON object (string keys, finite numbers, valid text)")
    else:
        if size > MAX_INPUT_BYTES:
            bad("input", f"is {size} bytes serialised; at most {MAX_INPUT_BYTES}")
    if not MIN_TIMEOUT_MS <= task.timeout_ms <= MAX_DURATION_MS:
        bad("timeout", f"must be between {MIN_TIMEOUT_MS} ms and 24 h")
    retry = task.retry
    if not 1 <= retry.max_attempts <= MAX_ATTEMPTS:
        bad("retry.max_attempts", f"must be 1 to {MAX_ATTEMPTS}")
    if not 0 <= retry.initial_backoff_ms <= MAX_DURATION_MS:
        bad("retry.initial_backoff", "must be between 0 and 24 h")
    if not retry.initial_backoff_ms <= retry.max_backoff_ms <= MAX_DURATION_MS:
        bad("retry.max_backoff", "must be at least initial_backoff and at most 24 h")
    if not 1.0 <= retry.multiplier <= MAX_BACKOFF_MULTIPLIER:
        bad("retry.backoff_multiplier", f"must be between 1 and {MAX_BACKOFF_MULTIPLIER:g}")
    for field_name, description in concurrency.violations(task.concurrency_limits):
        bad(field_name, f"task {quote(task.key)}: {description}")
    for field_name, description in ratelimits.violations(task.rate_limits):
        bad(field_name, f"task {quote(task.key)}: {description}")
    for field_name, description in placement.violations(task.placement):
        bad(field_name, f"task {quote(task.key)}: {description}")
    if not MIN_PRIORITY <= task.priority <= MAX_PRIORITY:
        bad("priority", f"task {quote(task.key)}: must be {MIN_PRIORITY} to {MAX_PRIORITY}")
    return found


def _dynamic_violations(spec: WorkflowSpec, first_index: Mapping[str, int]) -> list[FieldViolation]:
    """The rules of map, on_failure and always, which relate a task to others."""
    found: list[FieldViolation] = []
    always = {task.key for task in spec.tasks if task.always}
    if spec.tasks and len(always) == len(spec.tasks):
        found.append(
            FieldViolation(
                "definition.tasks", "at least one task must not be `always` (they run after it)"
            )
        )
    for index, task in enumerate(spec.tasks):
        where = f"definition.tasks[{index}]"
        if task.on_failure not in FAILURE_POLICIES:
            found.append(
                FieldViolation(
                    f"{where}.on_failure",
                    f"unknown policy {quote(str(task.on_failure))}; known: "
                    + ", ".join(FAILURE_POLICIES),
                )
            )
        if task.always:
            if task.map is not None:
                found.append(
                    FieldViolation(f"{where}.map", "an `always` task cannot be a map task")
                )
            if task.on_failure != "fail_run":
                found.append(
                    FieldViolation(
                        f"{where}.on_failure",
                        "does not apply to an `always` task: its failure never stops the run",
                    )
                )
        else:
            for dep_index, dependency in enumerate(task.depends_on):
                if dependency in always:
                    found.append(
                        FieldViolation(
                            f"{where}.depends_on[{dep_index}]",
                            f"{quote(dependency)} is an `always` task: only another `always` "
                            "task may depend on it",
                        )
                    )
        if task.map is not None:
            found.extend(_map_violations(where, task, first_index))
    return found


def _map_violations(
    where: str, task: TaskSpec, first_index: Mapping[str, int]
) -> list[FieldViolation]:
    assert task.map is not None
    found: list[FieldViolation] = []
    if task.map.over not in task.depends_on:
        found.append(
            FieldViolation(
                f"{where}.map.over",
                f"{quote(task.map.over)} must be one of the task's depends_on"
                + ("" if task.map.over in first_index else " (and a task of this workflow)"),
            )
        )
    if len(task.map.path) > MAX_MAP_PATH_CHARS or not MAP_PATH_PATTERN.fullmatch(task.map.path):
        found.append(
            FieldViolation(
                f"{where}.map.path",
                f"must be {MAP_PATH_RULE}, at most {MAX_MAP_PATH_CHARS} characters",
            )
        )
    reserved = [key for key in (MAP_ITEM_KEY, MAP_INDEX_KEY) if key in task.input]
    if reserved:
        found.append(
            FieldViolation(
                f"{where}.input",
                " and ".join(quote(key) for key in reserved)
                + f": {MAP_ITEM_KEY!r} and {MAP_INDEX_KEY!r} are set for each element of a map",
            )
        )
    return found


def _cycle_text(cycle: list[str]) -> str:
    # A cycle may run through thousands of tasks: the error names the first few.
    if len(cycle) <= _CYCLE_KEYS_SHOWN:
        return " -> ".join([*cycle, cycle[0]])
    return " -> ".join([*cycle[:_CYCLE_KEYS_SHOWN], f"... ({len(cycle)} tasks)"])


def find_cycle(tasks: Iterable[TaskSpec]) -> list[str] | None:
    """A dependency cycle as a list of keys, or None when the graph is acyclic."""
    edges = {t.key: list(t.depends_on) for t in tasks}
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(edges, white)
    for start in edges:
        if colour[start] != white:
            continue
        # Iterative DFS: a deep chain of 10,000 tasks must not hit the recursion limit.
        path: list[str] = [start]
        iterators = [iter(edges[start])]
        colour[start] = grey
        while iterators:
            dependency = next(iterators[-1], None)
            if dependency is None:
                colour[path.pop()] = black
                iterators.pop()
                continue
            if dependency not in colour:
                continue
            if colour[dependency] == grey:
                return path[path.index(dependency) :]
            if colour[dependency] == white:
                colour[dependency] = grey
                path.append(dependency)
                iterators.append(iter(edges[dependency]))
    return None
