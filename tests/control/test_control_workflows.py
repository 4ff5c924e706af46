"""CreateWorkflow, GetWorkflow, ListWorkflows over real gRPC and PostgreSQL."""

from __future__ import annotations

import base64

import grpc
import pytest

from awp.v1 import control_pb2, control_pb2_grpc, types_pb2
from awp_db.connect import Pool
from awp_kernel.definition_proto import spec_from_proto
from awp_protocol.jsonvalue import canonical_json, struct_to_dict
from awp_protocol.limits import DEFAULT_TIMEOUT_MS, MAX_INPUT_BYTES
from control.helpers import create_workflow, definition, expect_error, task
from kit.proto import seconds, struct

Stub = control_pb2_grpc.ControlServiceStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def test_create_then_get_fills_defaults(control: Stub) -> None:
    response = await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(
            definition=definition(
                tasks=[
                    task("a", input=struct({"n": 1, "nested": {"list": [1, "x", None]}})),
                    task(
                        "b",
                        ["a"],
                        retry=types_pb2.RetryPolicy(max_attempts=5),
                        timeout=seconds(30),
                    ),
                ],
                description="two steps",
                concurrency=4,
            )
        )
    )
    assert response.created
    got = (await control.GetWorkflow(control_pb2.GetWorkflowRequest(name="wf", version=1))).workflow
    assert got == response.workflow
    assert got.HasField("created_at")
    a, b = got.definition.tasks
    # Unset retry and timeout are stored as the defaults they stand for.
    assert a.retry.max_attempts == 3
    assert a.retry.initial_backoff.ToMilliseconds() == 1_000
    assert a.retry.max_backoff.ToMilliseconds() == 60_000
    assert a.retry.backoff_multiplier == 2.0
    assert a.timeout.ToMilliseconds() == DEFAULT_TIMEOUT_MS
    # Within a set retry, each unset field takes its own default.
    assert b.retry.max_attempts == 5
    assert b.retry.initial_backoff.ToMilliseconds() == 1_000
    assert b.timeout.ToMilliseconds() == 30_000
    assert list(b.depends_on) == ["a"]
    assert struct_to_dict(a.input) == {"n": 1, "nested": {"list": [1, "x", None]}}
    assert got.definition.concurrency == 4
    assert got.definition.description == "two steps"


async def test_get_version_zero_is_the_latest(control: Stub) -> None:
    for version in (1, 3, 2):
        await create_workflow(control, version=version)
    got = await control.GetWorkflow(control_pb2.GetWorkflowRequest(name="wf"))
    assert got.workflow.definition.version == 3


async def test_identical_recreate_is_idempotent_and_canonical(control: Stub, pool: Pool) -> None:
    tasks = [
        task("a", input=struct({"n": 1, "x": 1.5, "deep": {"k": [2, {"z": True}]}})),
        task("b", ["a"]),
    ]
    first = await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=definition(tasks=tasks))
    )
    again = await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=definition(tasks=tasks))
    )
    assert first.created and not again.created
    assert again.workflow == first.workflow
    # What GetWorkflow returns (defaults spelled out) is the same definition again:
    # exporting a workflow and applying it back is a no-op, not a conflict.
    exported = await control.CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=first.workflow.definition)
    )
    assert not exported.created

    rows = await pool.fetch("SELECT definition, definition_hash FROM workflows")
    assert len(rows) == 1
    spec = spec_from_proto(definition(tasks=tasks))
    assert bytes(rows[0]["definition_hash"]) == spec.definition_hash()
    assert canonical_json(rows[0]["definition"]) == canonical_json(spec.to_json())
    # Struct numbers are doubles; integral ones are stored as JSON integers.
    assert rows[0]["definition"]["tasks"][0]["input"] == {
        "n": 1,
        "x": 1.5,
        "deep": {"k": [2, {"z": True}]},
    }
    assert isinstance(rows[0]["definition"]["tasks"][0]["input"]["n"], int)


async def test_changed_definition_conflicts(control: Stub) -> None:
    await create_workflow(control)
    changed = definition(tasks=[task("a"), task("b", ["a"], action="test.other")])
    error = await expect_error(
        control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=changed)),
        grpc.StatusCode.ALREADY_EXISTS,
        "DEFINITION_CONFLICT",
    )
    assert "new version" in error.message
    # A new version of the same name is fine.
    assert (await create_workflow(control, version=2)).definition.version == 2


OVERSIZED = struct({"blob": "x" * MAX_INPUT_BYTES})


@pytest.mark.parametrize(
    ("workflow", "field"),
    [
        pytest.param(
            definition(tasks=[task("a", ["c"]), task("b", ["a"]), task("c", ["b"])]),
            "definition.tasks[0].depends_on",
            id="cycle",
        ),
        pytest.param(
            definition(tasks=[task("a"), task("b", ["a"]), task("c", ["nope"])]),
            "definition.tasks[2].depends_on[0]",
            id="unknown-dependency",
        ),
        pytest.param(
            definition(tasks=[task("a"), task("a")]), "definition.tasks[1].key", id="duplicate"
        ),
        pytest.param(
            definition(tasks=[task("a", ["a"])]),
            "definition.tasks[0].depends_on[0]",
            id="self-dependency",
        ),
        pytest.param(
            definition(tasks=[task("a", input=OVERSIZED)]),
            "definition.tasks[0].input",
            id="oversized-input",
        ),
        pytest.param(
            definition(tasks=[task("a", kind="shell")]),
            "definition.tasks[0].executor_kind",
            id="unknown-executor-kind",
        ),
        pytest.param(
            definition(tasks=[task("a", action="rm -rf /")]),
            "definition.tasks[0].action",
            id="action-is-a-command",
        ),
        pytest.param(
            definition(tasks=[task("a", input=struct({"x": float("nan")}))]),
            "definition.tasks[0].input",
            id="nan-input",
        ),
        pytest.param(
            definition(tasks=[task("a", input=struct({"x": "nul\x00"}))]),
            "definition.tasks[0].input",
            id="nul-in-input",
        ),
        pytest.param(
            definition(description="nul\x00"), "definition.description", id="nul-in-description"
        ),
        pytest.param(
            definition(tasks=[task("a", retry=types_pb2.RetryPolicy(backoff_multiplier=0.5))]),
            "definition.tasks[0].retry.backoff_multiplier",
            id="multiplier-below-one",
        ),
        pytest.param(
            definition(tasks=[task("a", timeout=seconds(-1))]),
            "definition.tasks[0].timeout",
            id="negative-timeout",
        ),
        pytest.param(definition(tasks=[]), "definition.tasks", id="no-tasks"),
        pytest.param(definition(version=0), "definition.version", id="version-zero"),
        pytest.param(definition(version=2**31), "definition.version", id="version-too-big"),
        pytest.param(definition(name="bad name"), "definition.name", id="bad-name"),
        pytest.param(
            definition(tasks=[task(f"t{i}") for i in range(10_001)]),
            "definition.tasks",
            id="too-many-tasks",
        ),
    ],
)
async def test_invalid_definitions_name_the_field(
    control: Stub, pool: Pool, workflow: types_pb2.WorkflowDefinition, field: str
) -> None:
    await expect_error(
        control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=workflow)),
        INVALID,
        "INVALID_DEFINITION",
        field,
    )
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 0


async def test_every_violation_is_reported_at_once(control: Stub) -> None:
    workflow = definition(
        name="bad name",
        tasks=[task("a", kind="shell", input=struct({"x": float("inf")})), task("b", ["zz"])],
    )
    error = await expect_error(
        control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=workflow)),
        INVALID,
        "INVALID_DEFINITION",
    )
    assert set(error.fields) >= {
        "definition.name",
        "definition.tasks[0].executor_kind",
        "definition.tasks[0].input",
        "definition.tasks[1].depends_on[0]",
    }


async def test_get_errors(control: Stub) -> None:
    await expect_error(
        control.GetWorkflow(control_pb2.GetWorkflowRequest(name="missing")),
        grpc.StatusCode.NOT_FOUND,
        "WORKFLOW_NOT_FOUND",
    )
    await create_workflow(control)
    await expect_error(
        control.GetWorkflow(control_pb2.GetWorkflowRequest(name="wf", version=2)),
        grpc.StatusCode.NOT_FOUND,
        "WORKFLOW_NOT_FOUND",
    )
    await expect_error(
        control.GetWorkflow(control_pb2.GetWorkflowRequest(name="")),
        INVALID,
        "INVALID_ARGUMENT",
        "name",
    )
    await expect_error(
        control.GetWorkflow(control_pb2.GetWorkflowRequest(name="wf", version=2**31)),
        INVALID,
        "INVALID_ARGUMENT",
        "version",
    )


async def list_all(
    control: Stub, page_size: int, name: str = ""
) -> list[list[control_pb2.Workflow]]:
    pages: list[list[control_pb2.Workflow]] = []
    token = ""
    while True:
        page = await control.ListWorkflows(
            control_pb2.ListWorkflowsRequest(name=name, page_size=page_size, page_token=token)
        )
        pages.append(list(page.workflows))
        token = page.next_page_token
        if not token:
            return pages


async def test_list_pages_through_everything_once(control: Stub) -> None:
    expected = []
    for name in ("beta", "alpha", "gamma"):
        for version in (2, 1, 3):
            await create_workflow(control, name=name, version=version)
            expected.append((name, version))
    expected.sort()

    pages = await list_all(control, page_size=4)
    assert [len(p) for p in pages] == [4, 4, 1]
    seen = [(w.definition.name, w.definition.version) for p in pages for w in p]
    assert seen == expected

    # Exactly one page's worth: no trailing empty page.
    assert [len(p) for p in await list_all(control, page_size=9)] == [9]
    assert [len(p) for p in await list_all(control, page_size=0)] == [9]  # default 100

    only_beta = [w.definition.version for p in await list_all(control, 2, "beta") for w in p]
    assert only_beta == [1, 2, 3]


async def test_list_page_size_is_capped(control: Stub, pool: Pool) -> None:
    specs = [spec_from_proto(definition(f"wf{i:04}")) for i in range(1_001)]
    rows = [(s.name, s.version, s.to_json(), s.definition_hash()) for s in specs]
    await pool.executemany(
        "INSERT INTO workflows (name, version, definition, definition_hash)"
        " VALUES ($1, $2, $3, $4)",
        rows,
    )
    page = await control.ListWorkflows(control_pb2.ListWorkflowsRequest(page_size=5_000))
    assert len(page.workflows) == 1_000
    rest = await control.ListWorkflows(
        control_pb2.ListWorkflowsRequest(page_size=5_000, page_token=page.next_page_token)
    )
    assert [w.definition.name for w in rest.workflows] == ["wf1000"]
    assert rest.next_page_token == ""
    default = await control.ListWorkflows(control_pb2.ListWorkflowsRequest())
    assert len(default.workflows) == 100


def _token(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "garbage!!",
        _token(b"not json"),
        _token(b'{"a": 1}'),
        _token(b'["w", "wf"]'),
        _token(b'["r", "wf", 1]'),  # another listing's kind
        _token(b'["w", "wf", 99999999999]'),  # past the integer column
        _token(b'["w", "wf", true]'),
        _token(b'["w", "bad\\u0000name", 1]'),
    ],
)
async def test_list_rejects_garbage_page_tokens(control: Stub, token: str) -> None:
    await expect_error(
        control.ListWorkflows(control_pb2.ListWorkflowsRequest(page_token=token)),
        INVALID,
        "INVALID_ARGUMENT",
        "page_token",
    )


async def test_list_rejects_a_bad_name_filter(control: Stub) -> None:
    await expect_error(
        control.ListWorkflows(control_pb2.ListWorkflowsRequest(name="no spaces")),
        INVALID,
        "INVALID_ARGUMENT",
        "name",
    )
