"""Building workflow definitions for the kernel's tests, and reading their violations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from awp_kernel.definition import DefinitionInvalid, TaskSpec, WorkflowSpec, validate
from awp_protocol.errors import FieldViolation


def task(key: str = "a", deps: Sequence[str] = (), **kwargs: Any) -> TaskSpec:
    kwargs.setdefault("executor_kind", "mock")
    kwargs.setdefault("action", "reports.summarize")
    return TaskSpec(key=key, depends_on=tuple(deps), **kwargs)


def spec(*tasks: TaskSpec, **kwargs: Any) -> WorkflowSpec:
    kwargs.setdefault("name", "wf")
    kwargs.setdefault("version", 1)
    return WorkflowSpec(tasks=tasks or (task(),), **kwargs)


def violations_of(workflow: WorkflowSpec, **kwargs: Any) -> tuple[FieldViolation, ...]:
    with pytest.raises(DefinitionInvalid) as caught:
        validate(workflow, **kwargs)
    assert caught.value.violations, "DefinitionInvalid must carry at least one violation"
    return caught.value.violations


def fields_of(workflow: WorkflowSpec, **kwargs: Any) -> list[str]:
    return [v.field for v in violations_of(workflow, **kwargs)]


def assert_only(workflow: WorkflowSpec, field: str) -> FieldViolation:
    """The spec is rejected with exactly one violation, on `field`."""
    found = violations_of(workflow)
    assert [v.field for v in found] == [field], found
    assert found[0].description
    return found[0]
