"""How long the console's page of a 5,000-task run takes to render, and whether it stays
responsive while the run's events stream in (DESIGN.md §10: a script that prints
figures, not a test).

    .venv/bin/python bench/console_bench.py              # 3 page loads per phase
    .venv/bin/python bench/console_bench.py --loads 5

What runs: `awp dev` in a throwaway directory (embedded PostgreSQL, awp-server,
awp-coordinator, 2 workers of concurrency 8, `awp console`), a workflow of 5,000 mock
tasks (a load task, 49 splits of 100 parts each, a merge per split, a report), one
run of it, and Debian's Chromium (/usr/bin/chromium) driven by Playwright.

Figures, each the median (min-max) over the page loads:

* server: from the request to the first byte of the page (GetRun of 5,000 tasks, the
  graph's layout, the template);
* ready: from navigation start until the page has drawn the graph and the task list
  (run.js sets html[data-run-page=ready]);
* while the run executes (the page open from its start to its end): the browser's long
  tasks (main thread busy > 50 ms: what a user feels as a freeze), their count, total
  and longest, and the time from the run's end to the page showing it;
* the same page load again once the run has ended (nothing to stream).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path

import grpc
from playwright.async_api import Page, async_playwright

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
SPLITS, PARTS = 49, 100
# Collects long tasks from the page's start (buffered) for the whole visit.
OBSERVE_LONG_TASKS = """
window.longTasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.longTasks.push(entry.duration);
}).observe({ type: "longtask", buffered: true });
"""


def definition() -> types_pb2.WorkflowDefinition:
    def task(key: str, after: list[str]) -> types_pb2.TaskDefinition:
        return types_pb2.TaskDefinition(
            key=key, executor_kind="mock", action="noop", depends_on=after
        )

    tasks = [task("load", [])]
    for s in range(SPLITS):
        tasks.append(task(f"split-{s:02d}", ["load"]))
        parts = [f"part-{s:02d}-{p:03d}" for p in range(PARTS)]
        tasks += [task(key, [f"split-{s:02d}"]) for key in parts]
        tasks.append(task(f"merge-{s:02d}", parts))
    tasks.append(task("report", [f"merge-{s:02d}" for s in range(SPLITS)]))
    assert len(tasks) == 5000
    return types_pb2.WorkflowDefinition(name="console-bench", version=1, tasks=tasks)


def start_dev(directory: Path) -> tuple[subprocess.Popen[str], str, str]:
    process = subprocess.Popen(
        [
            sys.executable, "-m", "awp_cli", "dev", "--data-dir", str(directory),
            "--listen", "127.0.0.1:0", "--metrics-port", "0", "--console-port", "0",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    address = url = ""
    deadline = time.monotonic() + 120
    for line in process.stdout:
        if found := re.search(r"awp-server listening on (\S+)", line):
            address = found[1]
        if found := re.search(r"console +(http://\S+)", line):
            url = found[1]
        if "awp dev: ready" in line or time.monotonic() > deadline:
            break
    if not (address and url):
        process.kill()
        raise SystemExit("awp dev did not start")
    return process, address, url


async def load(page: Page, url: str) -> tuple[float, float]:
    """(server ms, ready ms) of one visit."""
    await page.goto(url)
    await page.wait_for_selector("html[data-run-page=ready]", state="attached", timeout=120_000)
    timing = await page.evaluate(
        """() => {
          const [nav] = performance.getEntriesByType("navigation");
          const ready = performance.now();
          return [nav.responseStart - nav.requestStart, ready];
        }"""
    )
    return float(timing[0]), float(timing[1])


def spread(values: list[float], unit: str = "ms") -> str:
    return f"{statistics.median(values):.0f} {unit} ({min(values):.0f}-{max(values):.0f})"


async def bench(address: str, url: str, loads: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        control = control_pb2_grpc.ControlServiceStub(channel)
        await control.CreateWorkflow(control_pb2.CreateWorkflowRequest(definition=definition()))
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            # bypass_csp: the waits below evaluate scripts, which the console's policy
            # forbids its pages; the pages themselves run as they always do.
            context = await browser.new_context(
                viewport={"width": 1400, "height": 900}, bypass_csp=True
            )
            await context.add_init_script(OBSERVE_LONG_TASKS)
            page = await context.new_page()
            live = []
            runs = []
            for _ in range(loads):
                started = await control.StartRun(
                    runs_pb2.StartRunRequest(workflow_name="console-bench")
                )
                run_id = started.run.id
                runs.append(run_id)
                server_ms, ready_ms = await load(page, f"{url}/runs/{run_id}")
                # The page follows the run live until it has ended; when it shows the
                # end, the browser's clock says when (the same machine's as PostgreSQL's).
                shown = await page.wait_for_function(
                    "document.querySelector('#run-state')?.textContent.trim() === 'succeeded'"
                    " && Date.now()",
                    timeout=600_000,
                    polling="raf",
                )
                shown_at = float(await shown.json_value()) / 1000
                final = await control.GetRun(runs_pb2.GetRunRequest(run_id=run_id))
                ended = final.run.finished_at.ToDatetime(tzinfo=UTC).timestamp()
                long_tasks = await page.evaluate("window.longTasks")
                live.append((server_ms, ready_ms, long_tasks, (shown_at - ended) * 1000))
            finished = [await load(page, f"{url}/runs/{run_id}") for run_id in runs]
            await browser.close()
    print(f"console run page, 5,000 tasks ({loads} runs):")
    print(f"  opened at the run's start: server {spread([s for s, *_ in live])}, "
          f"ready {spread([r for _, r, *_ in live])}")  # fmt: skip
    counts = [len(t) for _, _, t, _ in live]
    totals = [sum(t) for _, _, t, _ in live]
    longest = [max(t, default=0.0) for _, _, t, _ in live]
    print(f"  while following the run live: long tasks {spread(counts, '')}, "
          f"busy {spread(totals)} in all, longest {spread(longest)}")  # fmt: skip
    print(f"  run's end shown after {spread([lag for *_, lag in live])}")
    print(f"  opened after the run's end: server {spread([s for s, _ in finished])}, "
          f"ready {spread([r for _, r in finished])}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=3, help="runs (and page loads) to time")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install chromium")
    directory = Path(tempfile.mkdtemp(prefix="awp-console-bench-"))
    process, address, url = start_dev(directory)
    try:
        asyncio.run(bench(address, url, args.loads))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(120)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
