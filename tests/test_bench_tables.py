"""The benchmark tables in README.md and docs/performance.md are bench/results.json as
committed: a figure edited by hand, or a results file committed without rerunning
bench/publish.py, fails here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


def publish() -> ModuleType:
    # As `python bench/publish.py` runs it: its own folder on the path for its helpers, for
    # the import only (bench/ holds names the fault tests' modules use too).
    bench = str(REPOSITORY / "bench")
    spec = importlib.util.spec_from_file_location("publish", REPOSITORY / "bench" / "publish.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, bench)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(bench)
    return module


def test_the_documents_show_the_committed_results() -> None:
    module = publish()
    results = json.loads((REPOSITORY / "bench" / "results.json").read_text())
    assert module.outdated(results) == [], "run .venv/bin/python bench/publish.py"


def test_a_figure_edited_by_hand_is_caught() -> None:
    module = publish()
    results = json.loads((REPOSITORY / "bench" / "results.json").read_text())
    awp = next(e for e in results if e["name"] == "single_run" and e["workers"] == 1)
    awp["tasks_per_s"]["median"] += 1
    assert REPOSITORY / "README.md" in module.outdated(results)


def test_missing_markers_are_named(tmp_path: Path) -> None:
    module = publish()
    document = tmp_path / "doc.md"
    with pytest.raises(SystemExit, match="markers"):
        module.replace_block("no markers here\n", ["x"], document)
