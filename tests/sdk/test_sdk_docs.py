"""docs/sdk.md and the README's example run as written, and `awp dev --reload` runs
changed action code.

Each ```python block of the page starts with a comment naming its file; the blocks are
written to a fresh directory, `awp dev --reload` is started there with a `--module` for
every block that is not a script (real PostgreSQL, server, coordinator, a worker), and
every block that says "run it with: python FILE" is run there, in page order, with
AWP_ADDRESS pointing at the stack. Then hello.py is edited: the worker must be restarted
and run the new code. The README's block is a module the workers import and a script.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.runner import ENV, REPOSITORY

DOC = REPOSITORY / "docs" / "sdk.md"
README = REPOSITORY / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
FILE_LINE = re.compile(r"# (\w+\.py)(?: — run it with: python (\w+\.py))?[^\n]*\n")
STARTUP_S = 90


@dataclass
class Project:
    directory: Path
    scripts: list[str]
    process: subprocess.Popen[str]
    address: str = ""
    lines: list[str] = field(default_factory=list)

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, script],
            cwd=self.directory,
            env=ENV | {"AWP_ADDRESS": self.address},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def blocks(page: Path = DOC) -> list[tuple[str, str, bool]]:
    """(file name, code, whether the page says to run it) of every python block."""
    found = []
    for code in BLOCK.findall(page.read_text()):
        named = FILE_LINE.match(code)
        assert named, f"a python block of {page.name} does not start with '# FILE.py':\n{code}"
        found.append((named[1], code, named[2] == named[1]))
    return found


def _read(project: Project, ready: threading.Event) -> None:
    assert project.process.stdout is not None
    for line in project.process.stdout:
        project.lines.append(line.rstrip("\n"))
        if found := re.search(r"awp-server listening on (\S+)", line):
            project.address = found[1]
        if "awp dev: ready" in line:
            ready.set()
    ready.set()


@pytest.fixture(scope="module")
def project() -> Iterator[Project]:
    # Not under pytest's basetemp: as root, PostgreSQL runs as a user that must traverse it.
    root = Path(tempfile.mkdtemp(prefix="awp-sdk-docs-"))
    directory = root / "project"
    directory.mkdir()
    scripts, modules = [], []
    for name, code, run in blocks():
        (directory / name).write_text(code)
        (scripts if run else modules).append(name)
    for name, code, _ in blocks(README):
        (directory / name).write_text(code)
        scripts.append(name)
        modules.append(name)
    module_args = [arg for name in modules for arg in ("--module", name.removesuffix(".py"))]
    process = subprocess.Popen(
        [
            sys.executable, "-m", "awp_cli", "dev",
            "--data-dir", str(root / "data"),
            "--listen", "127.0.0.1:0",
            "--metrics-port", "0",
            "--console-port", "0",
            "--workers", "1",
            *module_args,
            "--reload",
        ],
        cwd=directory,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    running = Project(directory, scripts, process)
    ready = threading.Event()
    threading.Thread(target=_read, args=(running, ready), daemon=True).start()
    try:
        assert ready.wait(STARTUP_S), "awp dev not ready:\n" + "\n".join(running.lines)
        assert process.poll() is None, "awp dev exited:\n" + "\n".join(running.lines)
        yield running
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_every_python_block_names_its_file() -> None:
    names = [name for name, _, _ in blocks()]
    assert "hello.py" in names and len(names) == len(set(names))


def test_the_page_starts_awp_dev_with_every_module_it_defines() -> None:
    modules = " ".join(f"--module {name[:-3]}" for name, _, run in blocks() if not run)
    assert f"awp dev {modules} --reload" in DOC.read_text()


def test_the_examples_run_as_written(project: Project) -> None:
    assert project.scripts, "no runnable example"
    outputs = {}
    for script in project.scripts:
        done = project.run(script)
        assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
        print(f"\n--- python {script}\n{done.stdout}", end="")
        outputs[script] = done.stdout
    # What the README's comment says it prints.
    assert outputs["digest.py"] == "{'outputs': [{'hits': 6}, {'hits': 7}]}\n"


def test_reload_restarts_the_worker_on_changed_code(project: Project) -> None:
    hello = project.directory / "hello.py"
    hello.write_text(hello.read_text().replace('f"hello, {', 'f"hi there, {'))
    probe = project.directory / "probe.py"
    probe.write_text(
        "from awp_sdk import Client\n"
        "from hello import wf\n"
        "with Client() as client:\n"
        "    outputs = client.start(wf, input={'name': 'Ada'}).result(timeout=60)\n"
        "    print(outputs['greet']['greeting'])\n"
    )
    # Runs started before the workers restarted may still run the old code: poll until a
    # run's output shows the new one (bounded by the count of tries).
    outputs = []
    for _ in range(20):
        done = project.run("probe.py")
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
        if outputs[-1] == "hi there, Ada":
            break
    print(f"\nreload: outputs until the new code ran: {outputs}")
    assert outputs[-1] == "hi there, Ada"
    assert any("changed: hello.py; restarting the workers" in line for line in project.lines)
