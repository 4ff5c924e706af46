"""The PromQL of deploy/: the alerting rules, the dashboard's panels and the
autoscaler's trigger, and the metric names they read."""

from __future__ import annotations

import json
import re

import yaml

from deploy.manifests import DEPLOY, KEDA, documents

ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yaml"
DASHBOARD = DEPLOY / "grafana" / "awp-dashboard.json"
# Grafana's own variable, replaced by a range before an expression is checked.
RATE_INTERVAL = "$__rate_interval"
METRIC = re.compile(r"\b(awp_[a-z0-9_]+)\b")


def alert_rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_queries() -> dict[str, str]:
    """panel id and target refId -> the expression, with $__rate_interval as 5m."""
    found = {}
    for panel in dashboard()["panels"]:  # type: ignore[attr-defined]
        for target in panel.get("targets", []):
            key = f"panel_{panel['id']}_{target['refId']}"
            found[key] = target["expr"].replace(RATE_INTERVAL, "5m")
    return found


def autoscaler_queries() -> list[str]:
    (scaled,) = documents(KEDA)
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]


def every_query() -> list[str]:
    alerts = [str(rule["expr"]) for rule in alert_rules()]
    return [*alerts, *dashboard_queries().values(), *autoscaler_queries()]


def metric_names(expressions: list[str]) -> set[str]:
    """The awp_ metrics the expressions read (as exported: a histogram's _bucket)."""
    return {name for expr in expressions for name in METRIC.findall(expr)}
