"""deploy/Dockerfile, read (CI has no container daemon to build it; the steps it runs are
deploy/image/install.sh's, which tests/packaging/test_wheel.py runs for real): two
stages, a pinned base, the shared install steps, a non-root user, a context holding
every source root, and a lock that pins every dependency pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib

from deploy.manifests import DEPLOY, REPOSITORY

DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
LOCK = DEPLOY / "image" / "requirements.lock"


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match[0]).lower()


def test_the_base_is_pinned_by_tag_and_digest_in_both_stages() -> None:
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    stages = re.findall(r"^FROM (\S+)", DOCKERFILE, re.MULTILINE)
    assert stages == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]


def test_the_build_runs_the_shared_install_steps() -> None:
    steps = re.findall(r"sh deploy/image/install\.sh (\w+)", DOCKERFILE)
    assert steps == ["wheel", "runtime"]
    assert "COPY --from=build /opt/awp /opt/awp" in DOCKERFILE


def test_the_image_runs_as_a_numeric_non_root_user_without_writes() -> None:
    (user,) = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE, re.MULTILINE)
    assert int(user[0]) != 0 and int(user[1]) != 0
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE and "HOME=/tmp" in DOCKERFILE


def test_the_build_context_holds_every_source_root() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {line[1:] for line in ignore if line.startswith("!")}
    roots = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"])
    assert roots | {"pyproject.toml", "README.md", "LICENSE", "deploy/image"} == kept
    assert "*" in ignore, "everything else is left out of the context"


def test_the_lock_pins_every_runtime_dependency_exactly() -> None:
    pinned = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"not an exact pin: {line}"
            pinned[_name(name)] = version
    declared = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert declared <= set(pinned), declared - set(pinned)
    (backend,) = PYPROJECT["build-system"]["requires"]
    build = (DEPLOY / "image" / "build.lock").read_text()
    assert re.search(rf"^{_name(backend)}==\S+$", build, re.MULTILINE), build
