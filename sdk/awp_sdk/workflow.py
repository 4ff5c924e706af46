"""Workflows in code: tasks declared next to the functions they run.

    wf = Workflow("digest", version=1, concurrency=4)

    @wf.task(retry=Retry(max_attempts=3, initial_backoff="250ms"), timeout="30s")
    async def fetch(ctx: ActionContext, input: dict) -> dict: ...

    @wf.task(map=Map(over=fetch, path="articles"), on_failure="continue")
    def summarize(ctx: ActionContext, input: dict) -> dict:
        return {"summary": input["item"]["text"][:200]}  # once per article

    @wf.task(always=True)
    def cleanup(ctx: ActionContext, input: dict) -> dict: ...

    @wf.task(concurrency=[Concurrency("user:{input.user_id}", max=2)])
    def answer(ctx: ActionContext, input: dict) -> dict: ...  # 2 at once per user

A decorated function stays callable as before and is registered as the action
"<workflow name>.<task key>" (``action=`` names it otherwise), so ``awp-worker --module``
runs it once it has imported the module. Dependencies are the task objects themselves,
never strings; a map's ``over`` task is a dependency without being listed. A Workflow
becomes the same plain data a workflow file holds (``to_dict``), so a workflow in code
and its YAML twin give identical definitions, and is checked with the server's own rules
before it is sent (``definition``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack, overload

from awp.v1 import types_pb2
from awp_sdk import definitions
from awp_sdk.actions import DEFAULT_REGISTRY, ActionRegistry

P = ParamSpec("P")
R = TypeVar("R")

# Seconds, a timedelta, or text such as "250ms", "30s", "2m".
Duration = float | int | str | timedelta


def _duration(value: Duration) -> float | str:
    return value.total_seconds() if isinstance(value, timedelta) else value


@dataclass(frozen=True)
class Retry:
    """A task's retry rule; what is left None takes the server's default (3 attempts, 1 s
    doubling up to 60 s)."""

    max_attempts: int | None = None
    initial_backoff: Duration | None = None
    max_backoff: Duration | None = None
    multiplier: float | None = None

    def to_dict(self) -> dict[str, Any]:
        given = {
            "max_attempts": self.max_attempts,
            "initial_backoff": (
                _duration(self.initial_backoff) if self.initial_backoff is not None else None
            ),
            "max_backoff": _duration(self.max_backoff) if self.max_backoff is not None else None,
            "multiplier": self.multiplier,
        }
        return {key: value for key, value in given.items() if value is not None}


@dataclass(frozen=True)
class Concurrency:
    """At most ``max`` live leases of tasks holding the key ``key`` renders to, across
    every run and workflow. ``key`` is literal text and placeholders naming the run's
    input (``"user:{input.user_id}"``); without a placeholder (``"llm"``) it is one limit
    shared by every task that declares it (docs/workflows.md, "Concurrency keys")."""

    key: str
    max: int

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "max": self.max}


@dataclass(frozen=True)
class Rate:
    """Each execution of the task charges ``units`` of the named rate limit ``limit``
    (set at run time: ``awp limits set``): a number, or one placeholder naming an integer
    of the run's input (``"{input.max_tokens}"``). The estimate is replaced by what the
    action reports (``ctx.report_usage``)."""

    limit: str
    units: int | str = 1

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "units": str(self.units)}


@dataclass(frozen=True)
class Map:
    """Run a task once per element of the list at ``path`` (dotted keys, e.g.
    "result.queries") in the output of task ``over``; each element's input holds the
    task's own input plus "item" and "index", and each has its own attempts."""

    over: Task
    path: str


class TaskOptions(TypedDict, total=False):
    """What ``@wf.task`` and ``wf.add`` take beside the key, the action and the kind.

    depends_on: tasks that must succeed first. input: the task's own JSON input. retry: a
    Retry, or a number of attempts. timeout: per attempt (default 5 minutes). map: run
    once per element of a list in another task's output (a Map). on_failure: "fail_run"
    (the default) or "continue" (the run goes on without this task's dependents).
    always: run once every other task has ended, success or failure (cleanup, notify).
    concurrency: keyed limits (Concurrency) each of its leases holds a unit of.
    rate_limits: named rate limits (Rate) each execution charges.
    priority: -10 to 10 (default 0), added to the run's; higher goes first, with aging.
    required_labels / preferred_labels: "key=value" worker labels it must have / prefers
    (a worker's models are "model=<name>"). resources: units of a worker's countable
    resources it reserves while it runs, e.g. {"gpu": 1}. sticky: prefer the worker that
    ran the run's most recent earlier task (default: the workflow's sticky).
    Any other option is refused with a TypeError naming it.
    """

    depends_on: Sequence[Task]
    input: Mapping[str, Any] | None
    retry: Retry | int | None
    timeout: Duration | None
    map: Map | None
    on_failure: definitions.OnFailure | None
    always: bool
    concurrency: Sequence[Concurrency]
    rate_limits: Sequence[Rate]
    priority: int
    required_labels: Sequence[str]
    preferred_labels: Sequence[str]
    resources: Mapping[str, int]
    sticky: bool


def check_options(key: str, options: Mapping[str, Any]) -> None:
    """TypeError naming an option TaskOptions does not have (and the one probably meant):
    a typo must not vanish from the definition unnoticed."""
    known = sorted(TaskOptions.__annotations__)
    for name in options:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"task {key!r}: unknown option {name!r}{hint}; the options are {', '.join(known)}"
        )


class Task:
    """One task of a Workflow: what ``depends_on`` and ``Map(over=...)`` take."""

    def __init__(
        self,
        workflow: Workflow,
        key: str,
        *,
        action: str,
        kind: str,
        **options: Unpack[TaskOptions],
    ) -> None:
        check_options(key, options)
        self.workflow = workflow
        self.key = key
        self.action = action
        self.kind = kind
        self.input = dict(options.get("input") or {})
        dependencies = workflow._own(options.get("depends_on", ()), key)
        self.map = options.get("map")
        if self.map is not None:
            (over,) = workflow._own([self.map.over], key)
            if over not in dependencies:
                dependencies.append(over)
        self.depends_on = tuple(dependencies)
        retry = options.get("retry")
        self.retry = Retry(max_attempts=retry) if isinstance(retry, int) else retry
        self.timeout = options.get("timeout")
        self.on_failure = options.get("on_failure")
        self.always = options.get("always", False)
        self.concurrency = tuple(options.get("concurrency", ()))
        self.rate_limits = tuple(options.get("rate_limits", ()))
        # A wait task's wait, as a workflow file writes it (Workflow.wait).
        self.wait: dict[str, Any] | None = None
        self.priority = options.get("priority", 0)
        self.required_labels = tuple(options.get("required_labels", ()))
        self.preferred_labels = tuple(options.get("preferred_labels", ()))
        self.resources = dict(options.get("resources", {}))
        # None: the workflow's.
        self.sticky: bool | None = options.get("sticky")

    def to_dict(self) -> dict[str, Any]:
        """The task as a workflow file writes it."""
        entry: dict[str, Any] = (
            {"key": self.key, "kind": self.kind, "action": self.action}
            if self.wait is None
            else {"key": self.key, "wait": self.wait}
        )
        if self.input:
            entry["input"] = self.input
        if self.depends_on:
            entry["depends_on"] = [task.key for task in self.depends_on]
        if self.retry is not None:
            entry["retry"] = self.retry.to_dict()
        if self.timeout is not None:
            entry["timeout"] = _duration(self.timeout)
        if self.map is not None:
            entry["map"] = {"over": self.map.over.key, "path": self.map.path}
        if self.on_failure is not None:
            entry["on_failure"] = self.on_failure
        if self.always:
            entry["always"] = True
        if self.concurrency:
            entry["concurrency_limits"] = [limit.to_dict() for limit in self.concurrency]
        if self.rate_limits:
            entry["rate_limits"] = [use.to_dict() for use in self.rate_limits]
        if self.priority:
            entry["priority"] = self.priority
        if self.required_labels:
            entry["required_labels"] = list(self.required_labels)
        if self.preferred_labels:
            entry["preferred_labels"] = list(self.preferred_labels)
        if self.resources:
            entry["resources"] = dict(self.resources)
        if self.sticky is not None:
            entry["sticky"] = self.sticky
        return entry

    def __repr__(self) -> str:
        return f"<Task {self.workflow.name}@{self.workflow.version}:{self.key} -> {self.action}>"


class TaskFunction(Task, Generic[P, R]):
    """A task that runs a Python function; calling it calls the function."""

    def __init__(self, workflow: Workflow, fn: Callable[P, R], **options: Any) -> None:
        super().__init__(workflow, **options)
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.key)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


class Workflow:
    """A workflow version defined in code: name, version, run concurrency and its tasks."""

    def __init__(
        self,
        name: str,
        version: int = 1,
        *,
        concurrency: int = 0,
        description: str = "",
        registry: ActionRegistry | None = None,
        sticky: bool = False,
    ) -> None:
        self.name = name
        self.version = version
        self.concurrency = concurrency
        # Each task's sticky unless it says otherwise (docs/workflows.md "Placement").
        self.sticky = sticky
        self.description = description
        self._registry = registry if registry is not None else DEFAULT_REGISTRY
        self._tasks: list[Task] = []

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(self._tasks)

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskFunction[P, R]: ...

    @overload
    def task(
        self, *, key: str | None = None, action: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        key: str | None = None,
        action: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Any:
        """Declares the decorated function a task of this workflow (kind "python").

        key: the task key (default: the function's name). action: the action name
        (default "<workflow name>.<key>"). The other options are TaskOptions.
        """

        def declare(function: Callable[..., Any]) -> TaskFunction[..., Any]:
            task_key = key or function.__name__
            name = action or f"{self.name}.{task_key}"
            declared = TaskFunction(
                self, function, key=task_key, action=name, kind="python", **options
            )
            self._registry.register(name, function)
            self._tasks.append(declared)
            return declared

        return declare(fn) if fn is not None else declare

    def add(
        self, key: str, *, action: str, kind: str = "python", **options: Unpack[TaskOptions]
    ) -> Task:
        """Declares a task whose action runs elsewhere: another executor kind (``mock``), a
        worker in another language, or an ``@action`` registered in another module. The
        options are TaskOptions."""
        declared = Task(self, key, action=action, kind=kind, **options)
        self._tasks.append(declared)
        return declared

    def wait(
        self,
        key: str,
        *,
        sleep: Duration | None = None,
        approval: str | None = None,
        timeout: Duration | None = None,
        role: str | None = None,
        depends_on: Sequence[Task] = (),
        on_failure: definitions.OnFailure | None = None,
    ) -> Task:
        """Declares a wait task, which no worker runs (docs/design.md §16): ``sleep`` (it
        succeeds once the time has passed) or ``approval`` (the prompt: it succeeds when
        approved, with the decision as its output, and fails when rejected or when
        ``timeout`` passes; ``role="admin"`` lets only admins decide)."""
        options: dict[str, Any] = {"depends_on": depends_on}
        if on_failure is not None:
            options["on_failure"] = on_failure
        declared = Task(self, key, action="", kind="", **options)
        wait: dict[str, Any] = {}
        if sleep is not None:
            wait["sleep"] = _duration(sleep)
        if approval is not None:
            wait["approval"] = approval
        if timeout is not None:
            wait["timeout"] = _duration(timeout)
        if role is not None:
            wait["role"] = role
        declared.wait = wait
        self._tasks.append(declared)
        return declared

    def to_dict(self) -> dict[str, Any]:
        """The workflow as a workflow file writes it (see awp_sdk.definitions)."""
        data: dict[str, Any] = {"name": self.name, "version": self.version}
        if self.description:
            data["description"] = self.description
        if self.concurrency:
            data["concurrency"] = self.concurrency
        if self.sticky:
            data["sticky"] = True
        data["tasks"] = [task.to_dict() for task in self._tasks]
        return data

    def definition(self) -> types_pb2.WorkflowDefinition:
        """The definition CreateWorkflow takes, checked with the server's own rules;
        DefinitionInvalid names every problem."""
        return definitions.validate(definitions.definition(self.to_dict()))

    def _own(self, tasks: Sequence[Task], key: str) -> list[Task]:
        """depends_on as given, checked to be tasks of this workflow."""
        if isinstance(tasks, str | Task):
            tasks = [tasks]
        found: list[Task] = []
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(
                    f"task {key!r}: depends_on takes the tasks themselves (depends_on=[fetch]), "
                    f"not {type(task).__name__} {task!r}"
                )
            if task.workflow is not self:
                raise ValueError(
                    f"task {key!r} depends on {task.key!r} of another workflow "
                    f"({task.workflow.name}@{task.workflow.version})"
                )
            found.append(task)
        return found

    def __repr__(self) -> str:
        return f"<Workflow {self.name}@{self.version}: {len(self._tasks)} tasks>"
