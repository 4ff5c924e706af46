"""Every metric the alerting rules, the dashboard and the autoscaler read is exported by
a running process: the local cluster topology (`awp dev --servers 2 --coordinators 2`,
what `make cluster` starts) runs a workflow with a retry, a failure and a cancellation,
and the union of every process's /metrics must name them all."""

from __future__ import annotations

import re
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.devstack import DevStack, launch
from deploy.queries import every_query, metric_names
from kit import poll_until

WORKFLOW = """\
name: metrics-tour
tasks:
  - {key: first, kind: mock, action: noop, input: {sleep_ms: 50}}
  - key: flaky
    kind: mock
    action: noop
    depends_on: [first]
    input: {fail_attempts: 1}
    retry: {max_attempts: 3, initial_backoff: 100ms}
  - {key: doomed, kind: mock, action: noop, depends_on: [first], input: {fail: "no"}}
"""
SLOW = """\
name: metrics-slow
tasks: [{key: nap, kind: mock, action: noop, input: {sleep_ms: 60000}}]
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[DevStack]:
    data_dir = Path(tempfile.mkdtemp(prefix="awp-metrics-test-"))
    dev = launch(
        data_dir,
        "--servers", "2", "--coordinators", "2", "--workers", "2",
        env={"AWP_COORDINATOR_STATS_INTERVAL": "250ms"},
    )  # fmt: skip
    try:
        dev.wait_ready()
        yield dev
    finally:
        code = dev.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert code == 0, dev.output()


def _endpoints(dev: DevStack) -> list[str]:
    (line,) = [line for line in dev.lines if line.strip().startswith("metrics ")]
    ports = re.findall(r":(\d+)(?:/metrics)? \(", line)
    return [f"http://127.0.0.1:{port}/metrics" for port in ports]


def _exported(endpoints: list[str]) -> dict[str, float]:
    """Sample name -> its values summed over every process."""
    totals: dict[str, float] = {}
    for url in endpoints:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


async def test_every_metric_the_rules_dashboard_and_autoscaler_read_is_exported(
    cluster: DevStack, tmp_path: Path
) -> None:
    endpoints = _endpoints(cluster)
    assert len(endpoints) == 2 + 2 + 2, endpoints
    (tmp_path / "tour.yaml").write_text(WORKFLOW)
    (tmp_path / "slow.yaml").write_text(SLOW)
    for name in ("tour.yaml", "slow.yaml"):
        applied = cluster.awp("workflow", "apply", str(tmp_path / name))
        assert applied.code == 0, applied.err
    finished = cluster.awp("run", "start", "metrics-tour", "--wait")
    assert finished.code == 1 and "doomed" in finished.out, finished.out + finished.err
    # A canceled run's running lease is revoked: the workers count revocations.
    run_id = cluster.awp("run", "start", "metrics-slow", "--json").json()["run"]["id"]
    await poll_until(
        lambda: '"TASK_STATE_RUNNING"' in cluster.awp("run", "get", run_id, "--json").out,
        "the slow task running",
        within=60,
        interval=0.2,
    )
    assert cluster.awp("run", "cancel", run_id, "--wait").code == 0

    needed = metric_names(every_query())

    def missing() -> set[str]:
        return needed - set(_exported(endpoints))

    try:
        await poll_until(lambda: not missing(), "every metric exported", within=60)
    except AssertionError:
        raise AssertionError(f"not exported: {sorted(missing())}") from None
    # Two coordinators, one leading: the leader gauge sums to one.
    await poll_until(
        lambda: _exported(endpoints)["awp_coordinator_leader"] == 1, "exactly one leader"
    )
    print(
        f"\nFIGURE {len(needed)} metrics read by the alerts, the dashboard and the "
        f"autoscaler, all exported by the {len(endpoints)} processes of the local cluster"
    )
