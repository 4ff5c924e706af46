"""Workflows for the fault scenarios, created and started through ControlService like a
user would (the CLI speaks the same API)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from cluster import ADMIN_AUTH
from google.protobuf import duration_pb2, struct_pb2

from awp.v1 import control_pb2, control_pb2_grpc, limits_pb2, runs_pb2, types_pb2


@dataclass(frozen=True, slots=True)
class Task:
    key: str
    depends_on: Sequence[str] = ()
    input: Mapping[str, Any] = field(default_factory=dict)
    # A map task: (upstream key, path of the list in its output).
    map: tuple[str, str] | None = None
    # Keyed limits: (key template, max) each (limits.proto).
    concurrency_limits: Sequence[tuple[str, int]] = ()
    # Rate limits: (limit name, units) each.
    rate_limits: Sequence[tuple[str, str]] = ()
    # Placement (TaskDefinition.required_labels, resources, sticky).
    required_labels: Sequence[str] = ()
    resources: Mapping[str, int] = field(default_factory=dict)
    sticky: bool = False


def _duration(ms: int) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromMilliseconds(ms)
    return value


def definition(
    name: str,
    tasks: Sequence[Task],
    *,
    max_attempts: int = 5,
    backoff_ms: int = 0,
    timeout_ms: int = 60_000,
    concurrency: int = 0,
) -> types_pb2.WorkflowDefinition:
    """Mock tasks; retries without backoff by default, so recoveries are measured bare."""
    retry = types_pb2.RetryPolicy(
        max_attempts=max_attempts,
        initial_backoff=_duration(backoff_ms),
        max_backoff=_duration(max(backoff_ms, 1000)),
        backoff_multiplier=2.0,
    )
    built = []
    for task in tasks:
        task_input = struct_pb2.Struct()
        task_input.update(dict(task.input))
        built.append(
            types_pb2.TaskDefinition(
                key=task.key,
                executor_kind="mock",
                action="fault.step",
                input=task_input,
                depends_on=list(task.depends_on),
                retry=retry,
                timeout=_duration(timeout_ms),
                map=None
                if task.map is None
                else types_pb2.TaskMap(over=task.map[0], path=task.map[1]),
                concurrency_limits=[
                    limits_pb2.ConcurrencyLimit(key=key, max=most)
                    for key, most in task.concurrency_limits
                ],
                rate_limits=[
                    limits_pb2.RateUse(limit=limit, units=units)
                    for limit, units in task.rate_limits
                ],
                required_labels=list(task.required_labels),
                resources=dict(task.resources),
                sticky=task.sticky,
            )
        )
    return types_pb2.WorkflowDefinition(name=name, version=1, concurrency=concurrency, tasks=built)


def independent(n: int, **task_input: Any) -> list[Task]:
    return [Task(f"t{i:03d}", (), task_input) for i in range(n)]


def fan_out_in(width: int, **task_input: Any) -> list[Task]:
    """start -> width parallel branches -> join."""
    branches = [Task(f"branch{i:02d}", ("start",), task_input) for i in range(width)]
    return [
        Task("start", (), task_input),
        *branches,
        Task("join", tuple(b.key for b in branches), task_input),
    ]


def layers(count: int, width: int, fan_in: int = 2, **task_input: Any) -> list[Task]:
    """count layers of width tasks; each task depends on fan_in tasks of the layer above."""
    tasks = []
    for layer in range(count):
        for i in range(width):
            deps: tuple[str, ...] = ()
            if layer:
                deps = tuple(
                    sorted({f"L{layer - 1:02d}.{(i + j) % width:03d}" for j in range(fan_in)})
                )
            tasks.append(Task(f"L{layer:02d}.{i:03d}", deps, task_input))
    return tasks


async def start(
    control: control_pb2_grpc.ControlServiceAsyncStub,
    workflow: types_pb2.WorkflowDefinition,
    run_input: Mapping[str, Any] | None = None,
) -> UUID:
    await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=workflow), metadata=ADMIN_AUTH, timeout=10
    )
    payload = struct_pb2.Struct()
    payload.update(dict(run_input or {}))
    response = await control.StartRun(
        runs_pb2.StartRunRequest(workflow_name=workflow.name, input=payload),
        metadata=ADMIN_AUTH,
        timeout=10,
    )
    return UUID(response.run.id)
