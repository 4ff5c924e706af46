"""The built wheel stands on its own: installed into a fresh virtualenv, away from this
checkout, every binary starts and `awp demo` runs the example workflow to success.

This is what a user who runs `pip install awp` gets, and what the container image holds:
the virtualenv is made by deploy/image/install.sh, the steps deploy/Dockerfile runs
(the wheel built with the pinned backend, then exactly the versions of
requirements.lock and the wheel, checked by `pip check`). It catches files that exist
only in the source tree (the demo, SQL migrations, .pyi stubs, the console's templates,
stylesheet and scripts), imports that only work
with the checkout on the path, and a lock that no longer satisfies pyproject.toml.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
INSTALL_SH = REPOSITORY / "deploy" / "image" / "install.sh"
BINARIES = ("awp", "awp-server", "awp-coordinator", "awp-worker")


def _run(
    argv: list[str], cwd: Path, timeout: float, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # Nothing of this checkout may leak in: no PYTHONPATH, no AWP_* settings.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AWP_")}
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env | (extra or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _checked(
    argv: list[str], cwd: Path, timeout: float, extra: dict[str, str] | None = None
) -> str:
    done = _run(argv, cwd, timeout, extra)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with only the wheel (and its dependencies) installed; its bin dir."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    # Build from the tracked files alone, as a release would: a copy keeps build/ and
    # *.egg-info out of the checkout.
    tracked = _checked(["git", "ls-files", "-z"], REPOSITORY, 60).split("\0")
    for name in filter(None, tracked):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPOSITORY / name).is_file():
            shutil.copy2(REPOSITORY / name, target)
    dist = root / "dist"
    venv = root / "venv"
    # The copy's script, as the image build runs the context's.
    install = [str(INSTALL_SH.relative_to(REPOSITORY))]
    _install(source, [*install, "wheel", str(source), str(dist)])
    (_wheel,) = dist.glob("awp-*.whl")
    _install(source, [*install, "runtime", str(venv), str(dist)])
    return venv / "bin"


def _install(cwd: Path, argv: list[str]) -> None:
    _checked(["sh", *argv], cwd, 900, {"PYTHON": sys.executable})


def test_every_binary_of_the_wheel_starts(installed: Path, tmp_path: Path) -> None:
    for binary in BINARIES:
        assert "usage:" in _checked([str(installed / binary), "--help"], tmp_path, 60)


def test_awp_demo_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    out = _checked([str(installed / "awp"), "demo"], tmp_path, 300)
    assert "awp demo succeeded" in out, out


async def test_the_console_serves_its_own_assets_from_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    source = REPOSITORY / "console" / "awp_console"
    assets = sorted(p.relative_to(source) for p in source.glob("*/*") if p.suffix in ASSETS)
    assert assets  # the templates, the stylesheet and the scripts
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AWP_")}
    console = await asyncio.create_subprocess_exec(
        str(installed / "awp"), "console", "--listen", "127.0.0.1:0",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert console.stdout is not None
        found = None
        async with asyncio.timeout(60):
            while found is None:
                line = (await console.stdout.readline()).decode()
                assert line, "awp console exited before it listened"
                found = re.search(r"awp console listening on (\S+)", line)
        # No awp-server is needed for the sign-in page (a template) and the static files.
        async with httpx.AsyncClient(base_url=found[1], timeout=10) as client:
            for path in [
                "/login",
                *(f"/static/{a.name}" for a in assets if a.parts[0] == "static"),
            ]:
                assert (await client.get(path)).status_code == 200, path
    finally:
        console.terminate()
        await console.wait()


ASSETS = (".html", ".css", ".js")
