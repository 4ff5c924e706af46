"""Watching a run in the console (Debian's Chromium against real processes): the runs
list names what failed, times tick, the graph fits its panel, a map shows its progress
live. Waits are Playwright's expect (a poll with a deadline), never a sleep."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from playwright.async_api import Page, expect

from awp.v1 import control_pb2, types_pb2
from console.conftest import Shot
from console.stack import ConsoleStack
from console.test_console_browser import sign_in

CHAIN: Final = "console-chain"
MAPPED: Final = "console-mapped"
FAILING: Final = "console-failing"
# More than the graph panel holds at full size, in both directions.
CHAIN_LENGTH: Final = 12


def _task(key: str, action: str, after: list[str], **more: object) -> types_pb2.TaskDefinition:
    return types_pb2.TaskDefinition(
        key=key,
        executor_kind="python",
        action=action,
        depends_on=after,
        retry=types_pb2.RetryPolicy(max_attempts=1),
        **more,  # type: ignore[arg-type]
    )


async def _create(stack: ConsoleStack, name: str, tasks: list[types_pb2.TaskDefinition]) -> None:
    definition = types_pb2.WorkflowDefinition(name=name, version=1, tasks=tasks)
    await stack.call("CreateWorkflow", control_pb2.CreateWorkflowRequest(definition=definition))


def _gates(tmp_path: Path) -> Path:
    gates = tmp_path / "gates"
    gates.mkdir()
    return gates


async def test_running_times_tick_on_the_run_page_and_the_runs_list(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    await stack.apply("console-held", [("hold", "console.gate", [])])
    gates = _gates(tmp_path)
    run_id = await stack.start_run("console-held", {"gates": str(gates)})
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    duration = page.locator("#run-duration")
    first = await duration.text_content()
    # A second later it says more, on the same page.
    await expect(duration).not_to_have_text(first or "")
    await expect(duration).to_have_text(re.compile(r"^\d+s$|^\d+m"))
    await shot(page, "running-for")
    await page.goto(f"{stack.url}/runs")
    cell = page.locator(f'tr[data-run="{run_id}"] td[data-elapsed]')
    listed = await cell.text_content()
    await expect(cell).not_to_have_text(listed or "")
    (gates / "hold").touch()
    await stack.wait_run(run_id, types_pb2.RUN_STATE_SUCCEEDED)
    await page.goto(f"{stack.url}/runs/{run_id}")
    # Ended: "Took", and it no longer counts.
    await expect(page.locator("#run-duration[data-elapsed]")).to_have_count(0)


async def test_the_graph_fits_its_panel_on_load_and_on_resize(
    page: Page, stack: ConsoleStack, shot: Shot
) -> None:
    # A chain, and a column of tasks beside it: wider and taller than the panel.
    chain = [
        _task(f"step{i:02d}", "console.fetch", [f"step{i - 1:02d}"] if i else [])
        for i in range(CHAIN_LENGTH)
    ]
    column = [_task(f"side{i:02d}", "console.fetch", []) for i in range(CHAIN_LENGTH)]
    await _create(stack, CHAIN, chain + column)
    run_id = await stack.start_run(CHAIN, {})
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await expect(page.locator("html[data-run-page=ready]")).to_have_count(1)

    async def fits() -> bool:
        fit: bool = await page.evaluate(
            """() => {
              const box = document.getElementById("graph");
              const svg = box.querySelector("svg.dag");
              const room = box.getBoundingClientRect(), drawn = svg.getBoundingClientRect();
              return drawn.width <= room.width && drawn.height <= room.height
                && +svg.getAttribute("width") < +svg.dataset.width;
            }"""
        )
        return fit

    await expect(page.locator('svg.dag [data-key="step11"]')).to_be_visible()
    assert await fits(), "the graph is cut off on load"
    await shot(page, "fitted-on-load")
    before = await page.locator("svg.dag").get_attribute("width")
    await page.set_viewport_size({"width": 700, "height": 700})
    await expect(page.locator("svg.dag")).not_to_have_attribute("width", before or "")
    assert await fits(), "the graph is cut off after a resize"
    await shot(page, "fitted-after-resize")
    # Zoomed by hand, it stays as asked.
    await page.click("[data-zoom=in]")
    zoomed = await page.locator("svg.dag").get_attribute("width")
    await page.set_viewport_size({"width": 1400, "height": 900})
    await expect(page.locator("svg.dag")).to_have_attribute("width", zoomed or "")


async def test_a_map_shows_its_progress_live_on_its_node(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    await _create(
        stack,
        MAPPED,
        [
            _task("plan", "console.gate", []),
            _task("list", "console.items", ["plan"], input={"items": [1, -2, 3]}),
            _task(
                "each",
                "console.element",
                ["list"],
                map=types_pb2.TaskMap(over="list", path="items"),
            ),
            _task("merge", "console.fetch", ["each"]),
        ],
    )
    gates = _gates(tmp_path)
    run_id = await stack.start_run(MAPPED, {"gates": str(gates)})
    await sign_in(page, stack, "victor", f"/runs/{run_id}")
    await expect(page.locator('svg.dag [data-key="plan"]')).to_have_class(
        re.compile(r"\bs-running\b")
    )
    # Before it fans out, the map is a task of its own.
    await expect(page.locator('svg.dag [data-key="each"]')).to_have_count(1)
    await page.evaluate("window.sameDocument = true")
    (gates / "plan").touch()
    node = page.locator('svg.dag [data-fanout="each"]')
    # One node for the map and its elements, its progress on it.
    await expect(node.locator(".progress-text")).to_have_text("0/3 done")
    await expect(node.locator(".label")).to_have_text("each[·] \u00d73")
    await expect(page.locator('svg.dag [data-key="each"]')).to_have_count(0)
    await expect(node).to_have_class(re.compile(r"\bs-running\b"))
    await shot(page, "map-started")
    (gates / "each[0]").touch()
    await expect(node.locator(".progress-text")).to_have_text("1/3 done")
    await shot(page, "map-one-done")
    (gates / "each[1]").touch()  # item -2: fails, and the run with it
    await expect(page.locator("#run-state")).to_have_text("failed")
    await expect(node.locator(".progress-text")).to_have_text(re.compile(r"/3 done, 1 failed$"))
    await expect(node).to_have_class(re.compile(r"\bs-failed\b"))
    assert await page.evaluate("window.sameDocument") is True
    await shot(page, "map-failed")
    # Drawn by the server the same way.
    await page.reload()
    await expect(node.locator(".progress-text")).to_have_text(re.compile(r"/3 done, 1 failed$"))
    await expect(page.locator("#task-count")).to_have_text("7 of 7")


async def test_the_runs_list_says_which_task_failed_and_why(
    page: Page, stack: ConsoleStack, shot: Shot, tmp_path: Path
) -> None:
    await stack.apply(
        FAILING,
        [("fetch", "console.fetch", []), ("parse", "console.parse", ["fetch"])],
    )
    marker = tmp_path / "fail"
    marker.touch()
    run_id = await stack.start_run(FAILING, {"fail_marker": str(marker)})
    await stack.wait_run(run_id, types_pb2.RUN_STATE_FAILED)
    await sign_in(page, stack, "victor", "/runs")
    failure = page.locator(f'tr[data-run="{run_id}"] td.failure')
    await expect(failure.locator("code")).to_have_text("parse")
    await expect(failure).to_contain_text("ValueError: record has no field 'missing'")
    await shot(page, "runs-failed-on")
