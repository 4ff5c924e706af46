from __future__ import annotations

import pytest
from wheel_kit import Build, build


@pytest.fixture(scope="session")
def wheel_build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The awp wheel, built once for every packaging test."""
    return build(tmp_path_factory.mktemp("wheel"))
