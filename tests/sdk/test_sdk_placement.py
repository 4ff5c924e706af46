"""docs/workflows.md's "Placement" example, executed: its YAML applied through the SDK to
a real server and coordinator, and a worker started through the SDK's worker API
(WorkerConfig) with labels, a resource and a model; the run's tasks run there, the
sticky one on the render's worker; ListWorkers shows what the worker declared; a task
no worker could run says why; the refusals the page prints are the code's words, and
the code spelling gives the same definition."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from awp_coordinator.coordinator import Coordinator
from awp_db.connect import Pool
from awp_sdk import AsyncClient, DefinitionInvalid, Workflow, definitions
from awp_worker._config import WorkerConfig
from awp_worker._runtime import WorkerRuntime
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerFactory, poll_until
from kit.invariants import check_committed

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
YAML_BLOCK = re.compile(r"```yaml\n(# placement\.yaml.*?)```", re.DOTALL)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def example() -> dict[str, Any]:
    match = YAML_BLOCK.search(PAGE.read_text())
    assert match is not None, "the placement.yaml block is missing from docs/workflows.md"
    loaded: dict[str, Any] = yaml.safe_load(match[1])
    return loaded


def page_shows(message: str) -> bool:
    flat = " ".join(message.split())
    plain = [text for lang, text in BLOCK.findall(PAGE.read_text()) if not lang]
    return any(flat in " ".join(text.split()) for text in plain)


@pytest.fixture
async def gpu_client(
    start_server: ServerFactory, coordinator: Coordinator
) -> AsyncIterator[AsyncClient]:
    server = await start_server(heartbeat_interval_s=0.5, lease_ttl_s=3.0)
    runtime = WorkerRuntime(
        WorkerConfig(
            server=server.address,
            worker_token=WORKER_TOKEN,
            name="gpu-worker",
            kinds=("mock",),
            concurrency=4,
            labels={"gpu": "a100"},
            resources={"gpu": 2},
            models=("llama3-8b",),
            claim_wait=0.5,
            reconnect_max=0.2,
            shutdown_grace=5.0,
            safety_margin=0.5,
        )
    )
    worker = asyncio.create_task(runtime.run())
    try:
        async with asyncio.timeout(10):
            await runtime.wait_registered()
        async with AsyncClient(server.address, token=ADMIN_TOKEN) as client:
            yield client
    finally:
        runtime.request_shutdown()
        async with asyncio.timeout(15):
            await worker


async def test_the_pages_example_runs_on_the_labelled_worker(
    gpu_client: AsyncClient, pool: Pool
) -> None:
    (worker,) = await gpu_client.list_workers()
    assert worker.labels == {"gpu": "a100"} and worker.models == ("llama3-8b",)
    assert worker.resources == {"gpu": 2}
    await gpu_client.apply(example())
    handle = await gpu_client.start("gpu-render")
    await handle.result(timeout=60)
    rows = await pool.fetch(
        """SELECT t.key, d.worker_id, d.sticky_worker, d.preferred_labels, d.resource_names
             FROM dispatches d JOIN tasks t ON t.id = d.task_id WHERE d.run_id = $1""",
        UUID(handle.id),
    )
    placed = {row["key"]: row for row in rows}
    assert str(placed["render"]["worker_id"]) == worker.id
    assert list(placed["render"]["preferred_labels"]) == ["model=llama3-8b"]
    assert placed["upscale"]["sticky_worker"] == placed["render"]["worker_id"]
    stored = await gpu_client.get_workflow("gpu-render")
    assert {task.key: dict(task.resources) for task in stored.tasks} == {
        "render": {"gpu": 1},
        "upscale": {"gpu": 1},
    }
    await check_committed(pool)


async def test_a_task_no_worker_can_run_says_why(gpu_client: AsyncClient) -> None:
    held = example()
    held["name"] = "gpu-h100"
    held["tasks"][0]["required_labels"] = ["gpu=h100"]
    await gpu_client.apply(held)
    handle = await gpu_client.start("gpu-h100")

    async def explained() -> str:
        detail = await gpu_client.get_run(handle.id)
        return detail.tasks["render"].waiting_for

    assert await poll_until(explained, "the reason") == "no active worker with label gpu=h100"
    await gpu_client.cancel(handle.id)


def test_the_code_spelling_gives_the_same_definition() -> None:
    wf = Workflow("gpu-render", version=1)
    render = wf.add(
        "render",
        action="echo",
        kind="mock",
        required_labels=["gpu=a100"],
        preferred_labels=["model=llama3-8b"],
        resources={"gpu": 1},
    )
    wf.add(
        "upscale",
        action="echo",
        kind="mock",
        depends_on=[render],
        required_labels=["gpu=a100"],
        resources={"gpu": 1},
        sticky=True,
    )
    assert wf.definition() == definitions.definition(example())


def test_a_workflow_level_sticky_makes_every_task_sticky() -> None:
    data = example()
    data["sticky"] = True
    del data["tasks"][1]["sticky"]
    assert [task.sticky for task in definitions.definition(data).tasks] == [True, True]


def test_bad_placement_is_refused_naming_the_task() -> None:
    bad = example()
    bad["tasks"][0]["resources"] = {"gpu": 0}
    with pytest.raises(DefinitionInvalid) as refused:
        definitions.validate(definitions.definition(bad))
    (violation,) = refused.value.violations
    assert page_shows(f"{violation.field}: {violation.description}"), violation


def test_a_bad_worker_flag_is_refused_as_the_page_prints() -> None:
    with pytest.raises(ValueError) as refused:
        WorkerConfig(kinds=("mock",), resources={"gpu": 0})
    assert page_shows(f"awp-worker: error: {refused.value}"), refused.value
