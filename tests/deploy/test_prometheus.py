"""The alerting rules and the dashboard: promtool checks the rules, runs their unit
tests (deploy/prometheus/alerts.test.yaml), and parses every expression of the dashboard
and of the autoscaler. (That every metric they name is exported by a running stack:
test_metrics_exported.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.queries import (
    ALERT_TESTS,
    ALERTS,
    alert_rules,
    autoscaler_queries,
    dashboard,
    dashboard_queries,
)


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool is missing (Debian: apt-get install prometheus)")
    return found


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_alerting_rules(promtool: str) -> None:
    checked = _promtool(promtool, "check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout
    print(f"\nFIGURE promtool check rules: {len(alert_rules())} alerting rules")


def test_the_alerts_fire_when_they_should_and_only_then(promtool: str) -> None:
    tested = _promtool(promtool, "test", "rules", str(ALERT_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    named = {c["alertname"] for case in cases for c in case["alert_rule_test"]}
    print(f"\nFIGURE promtool test rules: {len(named)} alerts tested in {len(cases)} cases")


def test_promtool_parses_every_dashboard_and_autoscaler_query(
    promtool: str, tmp_path: Path
) -> None:
    queries = {**dashboard_queries()}
    queries |= {f"autoscaler_{i}": q for i, q in enumerate(autoscaler_queries())}
    # As recording rules, promtool parses each expression as Prometheus would.
    rules = {
        "groups": [
            {
                "name": "parse-only",
                "rules": [{"record": f"awp:{key}", "expr": expr} for key, expr in queries.items()],
            }
        ]
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = _promtool(promtool, "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    print(f"\nFIGURE promtool parsed {len(queries)} dashboard and autoscaler queries")


def test_promtool_refuses_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """The check can fail."""
    broken = {"groups": [{"name": "x", "rules": [{"alert": "X", "expr": "sum(rate(awp_x[5m])"}]}]}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert _promtool(promtool, "check", "rules", str(path)).returncode != 0


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    names = [str(rule["alert"]) for rule in alert_rules()]
    assert len(names) == len(set(names))
    for rule in alert_rules():
        labels, annotations = rule["labels"], rule["annotations"]
        assert isinstance(labels, dict) and isinstance(annotations, dict)
        assert labels["severity"] in ("critical", "warning"), rule["alert"]
        assert annotations["summary"] and annotations["description"], rule["alert"]


def test_the_dashboard_is_one_grafana_dashboard_on_a_chosen_prometheus() -> None:
    board = dashboard()
    panels = board["panels"]
    assert isinstance(panels, list)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    (variable,) = board["templating"]["list"]  # type: ignore[index]
    assert variable == {**variable, "name": "datasource", "type": "datasource"}
    for panel in panels:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
