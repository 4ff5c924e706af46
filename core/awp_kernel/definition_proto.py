"""A workflow definition as the API sends it (awp.v1.WorkflowDefinition) -> the kernel's
WorkflowSpec, defaults filled in, validated.

One function for the server (CreateWorkflow) and for the SDK, which validates a
definition before sending it: both refuse the same definitions with the same words.
"""

from __future__ import annotations

from typing import Final, cast

from google.protobuf import duration_pb2

from awp.v1 import types_pb2
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import (
    KNOWN_EXECUTOR_KINDS,
    DefinitionInvalid,
    FailurePolicy,
    MapSpec,
    TaskSpec,
    WorkflowSpec,
    validate,
)
from awp_kernel.placement import Placement
from awp_kernel.ratelimits import RateUse
from awp_kernel.retry import RetryPolicy
from awp_kernel.wait_tasks import WaitTaskKind, WaitTaskSpec
from awp_protocol.errors import FieldViolation
from awp_protocol.jsonvalue import JsonInvalid, struct_to_dict
from awp_protocol.limits import DEFAULT_TIMEOUT_MS, MAX_TASKS


def spec_from_proto(
    definition: types_pb2.WorkflowDefinition,
    known_kinds: frozenset[str] = KNOWN_EXECUTOR_KINDS,
) -> WorkflowSpec:
    """The validated spec of a definition, defaults filled in.

    Within `retry`, each unset field takes its default (proto3 cannot tell an unset
    max_attempts or multiplier from 0, and 0 is never valid for either). Raises
    DefinitionInvalid naming every offending field, e.g. definition.tasks[2].depends_on[0].
    """
    if len(definition.tasks) > MAX_TASKS:
        # Refuse before converting: a huge list is not worth walking to report this.
        raise DefinitionInvalid(
            [
                FieldViolation(
                    "definition.tasks", f"at most {MAX_TASKS} tasks, got {len(definition.tasks)}"
                )
            ]
        )
    violations: list[FieldViolation] = []
    tasks = []
    for index, task in enumerate(definition.tasks):
        try:
            task_input = struct_to_dict(task.input)
        except JsonInvalid as exc:
            violations.append(FieldViolation(f"definition.tasks[{index}].input", str(exc)))
            task_input = {}
        tasks.append(
            TaskSpec(
                key=task.key,
                executor_kind=task.executor_kind,
                action=task.action,
                input=task_input,
                depends_on=tuple(task.depends_on),
                retry=_retry_from_proto(task.retry) if task.HasField("retry") else RetryPolicy(),
                timeout_ms=(_ms(task.timeout) if task.HasField("timeout") else DEFAULT_TIMEOUT_MS),
                map=MapSpec(task.map.over, task.map.path) if task.HasField("map") else None,
                on_failure=_policy_from_proto(task.on_failure),
                always=task.always,
                concurrency_limits=tuple(
                    ConcurrencyLimit(limit.key, limit.max) for limit in task.concurrency_limits
                ),
                rate_limits=tuple(RateUse(use.limit, use.units) for use in task.rate_limits),
                wait=_wait_from_proto(task.wait) if task.HasField("wait") else None,
                priority=task.priority,
                placement=Placement.of(
                    list(task.required_labels),
                    list(task.preferred_labels),
                    dict(task.resources),
                    task.sticky,
                ),
            )
        )
    spec = WorkflowSpec(
        name=definition.name,
        version=definition.version,
        tasks=tuple(tasks),
        description=definition.description,
        concurrency=definition.concurrency,
    )
    try:
        validate(spec, known_kinds)
    except DefinitionInvalid as exc:
        violations.extend(exc.violations)
    if violations:
        raise DefinitionInvalid(violations)
    return spec


def _wait_from_proto(wait: types_pb2.WaitTaskDefinition) -> WaitTaskSpec:
    """A wait task's wait; an unknown kind goes on to validation, which names it."""
    kinds = {
        types_pb2.CHECKPOINT_KIND_SLEEP: "sleep",
        types_pb2.CHECKPOINT_KIND_APPROVAL: "approval",
    }
    return WaitTaskSpec(
        kind=cast(WaitTaskKind, kinds.get(wait.kind, f"number {int(wait.kind)}")),
        sleep_ms=_ms(wait.sleep) if wait.HasField("sleep") else None,
        prompt=wait.prompt,
        timeout_ms=_ms(wait.timeout) if wait.HasField("timeout") else None,
        role=wait.role,
    )


_POLICY_PREFIX: Final = "FAILURE_POLICY_"


def _policy_from_proto(value: types_pb2.FailurePolicy.ValueType) -> FailurePolicy:
    """Unset is the default, fail_run; a number this build does not know goes on to
    validation as it is, which refuses it naming the field."""
    if value == types_pb2.FAILURE_POLICY_UNSPECIFIED:
        return "fail_run"
    try:
        name = types_pb2.FailurePolicy.Name(value).removeprefix(_POLICY_PREFIX).lower()
    except ValueError:
        name = f"number {int(value)}"
    return cast(FailurePolicy, name)


def _retry_from_proto(retry: types_pb2.RetryPolicy) -> RetryPolicy:
    default = RetryPolicy()
    return RetryPolicy(
        max_attempts=retry.max_attempts or default.max_attempts,
        initial_backoff_ms=(
            _ms(retry.initial_backoff)
            if retry.HasField("initial_backoff")
            else default.initial_backoff_ms
        ),
        max_backoff_ms=(
            _ms(retry.max_backoff) if retry.HasField("max_backoff") else default.max_backoff_ms
        ),
        multiplier=retry.backoff_multiplier or default.multiplier,
    )


def _ms(value: duration_pb2.Duration) -> int:
    return value.ToMilliseconds()
