"""Building the awp wheel as a release (and the image) does, and running what it installs
away from this checkout: shared by the packaging tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
INSTALL_SH = REPOSITORY / "deploy" / "image" / "install.sh"
LOCK = REPOSITORY / "deploy" / "image" / "requirements.lock"


def clean_env() -> dict[str, str]:
    """Nothing of this checkout may leak in: no PYTHONPATH, no AWP_* settings."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AWP_")}


def run(
    argv: list[str], cwd: Path, timeout: float, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=clean_env() | (extra or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def checked(argv: list[str], cwd: Path, timeout: float, extra: dict[str, str] | None = None) -> str:
    done = run(argv, cwd, timeout, extra)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Build:
    """The tracked source tree's copy and the wheel built from it."""

    source: Path
    dist: Path

    @property
    def wheel(self) -> Path:
        (wheel,) = self.dist.glob("awp-*.whl")
        return wheel

    def install_sh(self, *args: str) -> None:
        """deploy/image/install.sh of the copy, as the image build runs the context's."""
        script = str(INSTALL_SH.relative_to(REPOSITORY))
        checked(["sh", script, *args], self.source, 900, {"PYTHON": sys.executable})


def build(root: Path) -> Build:
    """The wheel, from the tracked files alone as a release would build it: a copy keeps
    build/ and *.egg-info out of the checkout."""
    source = root / "source"
    tracked = checked(["git", "ls-files", "-z"], REPOSITORY, 60).split("\0")
    for name in filter(None, tracked):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPOSITORY / name).is_file():
            shutil.copy2(REPOSITORY / name, target)
    built = Build(source, root / "dist")
    built.install_sh("wheel", str(source), str(built.dist))
    return built
