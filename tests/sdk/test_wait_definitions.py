"""Wait tasks in workflow definitions (docs/design.md §16): a workflow in code
(Workflow.wait) and the same workflow as a file give identical definitions, checked by
the server's own rules; a malformed wait is named."""

from __future__ import annotations

import pytest
import yaml

from awp.v1 import types_pb2
from awp_sdk import Workflow, definitions
from awp_sdk.errors import DefinitionInvalid

FILE = """
name: gated
version: 1
tasks:
  - key: fetch
    kind: mock
    action: fetch
  - key: gate
    wait: {approval: "Publish?", timeout: 1h, role: admin}
    depends_on: [fetch]
  - key: nap
    wait: {sleep: 90s}
    depends_on: [gate]
    on_failure: continue
"""


def test_a_wait_task_in_code_and_in_a_file_is_the_same_definition() -> None:
    flow = Workflow("gated", 1)
    fetch = flow.add("fetch", action="fetch", kind="mock")
    gate = flow.wait("gate", approval="Publish?", timeout="1h", role="admin", depends_on=[fetch])
    flow.wait("nap", sleep=90, depends_on=[gate], on_failure="continue")
    in_code = flow.definition()
    assert in_code == definitions.validate(definitions.definition(yaml.safe_load(FILE)))
    gate_task = in_code.tasks[1]
    assert (gate_task.executor_kind, gate_task.action) == ("", "")
    assert gate_task.wait.kind == types_pb2.CHECKPOINT_KIND_APPROVAL
    assert gate_task.wait.timeout.seconds == 3600 and gate_task.wait.role == "admin"
    assert in_code.tasks[2].wait.sleep.seconds == 90


@pytest.mark.parametrize(
    ("wait", "field", "problem"),
    [
        ({"sleep": 1, "approval": "x"}, "tasks[0].wait", "exactly one of sleep and approval"),
        ({"approval": ""}, "definition.tasks[0].wait.prompt", "needs a prompt"),
        ({"approval": "x", "role": "boss"}, "definition.tasks[0].wait.role", "'admin'"),
        ({"sleep": "400d"}, "definition.tasks[0].wait.sleep", "between 0 and"),
        ({"snooze": 1}, "tasks[0].wait", "snooze"),
    ],
)
def test_a_malformed_wait_is_named(wait: dict[str, object], field: str, problem: str) -> None:
    data = {"name": "bad", "version": 1, "tasks": [{"key": "a", "wait": wait}]}
    with pytest.raises(DefinitionInvalid) as caught:
        definitions.validate(definitions.definition(data))
    assert any(
        v.field.startswith(field) and problem in v.description for v in caught.value.violations
    ), caught.value.violations
