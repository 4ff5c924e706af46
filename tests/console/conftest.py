"""Fixtures of the console's browser tests: one real stack and one Chromium per module,
a fresh browser context per test, and screenshots kept as artefacts.

Chromium is Debian's (/usr/bin/chromium, installed by .ci/run): Playwright drives it but
downloads nothing. Screenshots go to tests/artifacts/console/<test>/ (git-ignored);
a failed test also leaves failed.png and failed.html there, taken as it failed.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from awp_db.connect import connect
from console.stack import WAIT_MS, ConsoleStack, start
from kit.postgres import PostgresHandle

CHROMIUM = "/usr/bin/chromium"
# Every expect(...) polls until WAIT_MS, as every action of the page does.
expect.set_options(timeout=WAIT_MS)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
FAILED = pytest.StashKey[bool]()
STACKS = pytest.StashKey[ConsoleStack]()
Shot = Callable[[Page, str], Awaitable[Path]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[FAILED] = True
        stack = item.stash.get(STACKS, None)
        if stack is not None:
            report.sections.append(("awp processes' log tails", stack.logs()))
    return report


@pytest.fixture(scope="module")
async def stack(
    postgres: PostgresHandle, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ConsoleStack]:
    name = f"awp_console_{uuid.uuid4().hex[:12]}"
    admin = await connect(postgres.admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_database}")
    finally:
        await admin.close()
    running = await start(tmp_path_factory.mktemp("console-stack"), postgres.dsn(name))
    try:
        yield running
    finally:
        await running.stop()
        admin = await connect(postgres.admin_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    directory = ARTIFACTS / re.sub(r"[^\w.-]+", "_", request.node.name)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


@pytest.fixture
async def page(
    request: pytest.FixtureRequest, chromium: Browser, stack: ConsoleStack, artifacts: Path
) -> AsyncIterator[Page]:
    request.node.stash[STACKS] = stack
    context = await chromium.new_context(viewport={"width": 1400, "height": 900})
    opened = await context.new_page()
    opened.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
        # A script error is a failure even when the page still looked right.
        assert not errors, f"errors in the page's scripts: {errors}"
    finally:
        if request.node.stash.get(FAILED, False):
            await opened.screenshot(path=artifacts / "failed.png", full_page=True)
            (artifacts / "failed.html").write_text(await opened.content())
        await context.close()


@pytest.fixture
def shot(artifacts: Path) -> Shot:
    """Saves a full-page screenshot as an artefact, numbered in the order taken."""
    taken: list[Path] = []

    async def take(page: Page, name: str) -> Path:
        path = artifacts / f"{len(taken) + 1:02d}-{name}.png"
        await page.screenshot(path=path, full_page=True)
        taken.append(path)
        return path

    return take
