"""The built wheel stands on its own: installed into a fresh virtualenv, away from this
checkout, every binary starts and `awp demo` runs the example workflow to success.

This is what a user who runs `pip install 'awp[all]'` gets, and what the container image
holds: the virtualenv is made by deploy/image/install.sh, the steps deploy/Dockerfile runs
(the wheel built with the pinned backend, then exactly the versions of
requirements.lock and the wheel, checked by `pip check` and by resolving awp[all] offline).
The base install alone (`pip install awp`) is test_base_install.py's. It catches files that exist
only in the source tree (the demo, SQL migrations, .pyi stubs, the console's templates,
stylesheet and scripts), imports that only work
with the checkout on the path, and a lock that no longer satisfies pyproject.toml.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from wheel_kit import REPOSITORY, Build, checked, clean_env

BINARIES = ("awp", "awp-server", "awp-coordinator", "awp-worker")


@pytest.fixture(scope="module")
def installed(wheel_build: Build) -> Path:
    """A virtualenv made as the image's: the lock's exact versions (every extra's), then
    the wheel; its bin dir."""
    venv = wheel_build.source.parent / "venv"
    wheel_build.install_sh("runtime", str(venv), str(wheel_build.dist))
    return venv / "bin"


def test_every_binary_of_the_wheel_starts(installed: Path, tmp_path: Path) -> None:
    for binary in BINARIES:
        assert "usage:" in checked([str(installed / binary), "--help"], tmp_path, 60)


def test_awp_demo_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    out = checked([str(installed / "awp"), "demo"], tmp_path, 300)
    assert "awp demo succeeded" in out, out


async def test_the_console_serves_its_own_assets_from_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    source = REPOSITORY / "console" / "awp_console"
    assets = sorted(p.relative_to(source) for p in source.glob("*/*") if p.suffix in ASSETS)
    assert assets  # the templates, the stylesheet and the scripts
    env = clean_env()
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
