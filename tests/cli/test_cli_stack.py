"""Every awp command as a subprocess against one `awp dev` stack (real PostgreSQL, server,
coordinator, two workers), started once for this module on free ports in a fresh
directory, and stopped at the end with SIGINT, which must end it cleanly."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from awp_common.processes import free_port
from cli.devstack import DevStack, dev_stack
from cli.runner import Result, awp


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    yield from dev_stack(["awp_demo.workflow"])


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


FLAKY = """\
name: {name}
version: 1
description: a fan-out whose middle task fails once
tasks:
  - key: first
    kind: mock
    action: noop
    input: {{sleep_ms: 50}}
  - key: flaky
    kind: mock
    action: noop
    depends_on: [first]
    input: {{fail_attempts: 1}}
    retry: {{max_attempts: 3, initial_backoff: 100ms, max_backoff: 1s, multiplier: 2}}
    timeout: 30s
  - key: plan
    kind: python
    action: research-digest.plan
    depends_on: [flaky]
    input: {{topic: cli, sources: [news, forum]}}
"""


def test_apply_list_and_get_a_workflow(stack: DevStack, tmp_path: Path) -> None:
    path = write(tmp_path, "flaky.yaml", FLAKY.format(name="cli-flaky"))
    applied = stack.awp("workflow", "apply", str(path))
    assert applied.code == 0, applied.err
    assert "created workflow cli-flaky@1 (3 tasks)" in applied.out
    again = stack.awp("workflow", "apply", str(path), "--json")
    assert again.code == 0
    assert again.json().get("created", False) is False  # protobuf JSON omits false
    listed = stack.awp("--json", "workflow", "list")
    assert "cli-flaky" in [w["definition"]["name"] for w in listed.json()["workflows"]]
    got = stack.awp("workflow", "get", "cli-flaky@1", "--json").json()
    flaky = got["definition"]["tasks"][1]
    assert flaky["dependsOn"] == ["first"]
    assert flaky["retry"]["initialBackoff"] == "0.100s"
    assert flaky["timeout"] == "30s"
    table = stack.awp("workflow", "get", "cli-flaky")
    assert table.code == 0 and "research-digest.plan" in table.out

    # `get --json` is a file `apply` takes back: edit it into version 2.
    got["definition"]["version"] = 2
    exported = write(tmp_path, "exported.json", json.dumps(got))
    assert stack.awp("workflow", "apply", str(exported)).code == 0
    latest = stack.awp("workflow", "get", "cli-flaky", "--json").json()
    assert latest["definition"]["version"] == 2


def test_run_start_wait_follows_a_retry_to_success(stack: DevStack, tmp_path: Path) -> None:
    assert (
        stack.awp(
            "workflow", "apply", str(write(tmp_path, "w.yaml", FLAKY.format(name="cli-ok")))
        ).code
        == 0
    )
    waited = stack.awp("run", "start", "cli-ok", "--wait", "--input", '{"who": "test"}')
    assert waited.code == 0, waited.out + waited.err
    assert re.search(r"run \S+ succeeded in", waited.out)
    assert "flaky (2 attempts)" in waited.out
    assert "waiting_retry" in waited.out  # the progress lines showed the retry

    final = stack.awp("run", "start", "cli-ok", "--wait", "--json").json()
    assert final["run"]["state"] == "RUN_STATE_SUCCEEDED"
    assert final["run"]["tasksByState"] == [{"state": "TASK_STATE_SUCCEEDED", "count": 3}]
    tasks = {t["key"]: t for t in final["tasks"]}
    assert tasks["flaky"]["attempts"] == 2
    assert len(tasks["plan"]["output"]["queries"]) == 2


def test_a_failing_run_exits_1(stack: DevStack, tmp_path: Path) -> None:
    failing = write(
        tmp_path,
        "failing.yaml",
        """\
name: cli-failing
tasks:
  - {key: doomed, kind: mock, action: noop, input: {fail: "upstream said no"}}
  - {key: after, kind: mock, action: noop, depends_on: [doomed]}
""",
    )
    assert stack.awp("workflow", "apply", str(failing)).code == 0
    waited = stack.awp("run", "start", "cli-failing", "--wait")
    assert waited.code == 1, waited.out + waited.err
    assert "failed:   doomed: upstream said no" in waited.out
    assert "1 skipped" in waited.out


def test_run_get_list_watch_and_request_ids(stack: DevStack, tmp_path: Path) -> None:
    path = write(tmp_path, "w.yaml", FLAKY.format(name="cli-watch"))
    assert stack.awp("workflow", "apply", str(path)).code == 0
    started = stack.awp("run", "start", "cli-watch", "--request-id", "once", "--json").json()
    run_id = started["run"]["id"]
    assert started["created"] is True
    again = stack.awp("run", "start", "cli-watch", "--request-id", "once")
    assert again.code == 0 and "already started" in again.out

    watched = stack.awp("run", "watch", run_id, "--json")
    assert watched.code == 0, watched.err
    events = watched.json_lines()
    assert [int(e["seq"]) for e in events] == list(range(1, len(events) + 1))
    assert (events[-1]["type"], events[-1]["runTransition"]["toState"]) == (
        "EVENT_TYPE_RUN_STATE",
        "RUN_STATE_SUCCEEDED",
    )
    tail = stack.awp("run", "watch", run_id, "--after-seq", str(len(events) - 1), "--json")
    assert [e["type"] for e in tail.json_lines()] == ["EVENT_TYPE_RUN_STATE"]
    human = stack.awp("run", "watch", run_id)
    assert human.code == 0 and "running -> succeeded" in human.out

    got = stack.awp("run", "get", run_id, "--json").json()
    assert got["run"]["state"] == "RUN_STATE_SUCCEEDED"
    assert got["run"]["tasksByState"] == [{"state": "TASK_STATE_SUCCEEDED", "count": 3}]
    assert {a["taskKey"] for a in got["attempts"]} == {"first", "flaky", "plan"}
    shown = stack.awp("run", "get", run_id)
    assert shown.code == 0 and "mock retryable failure" in shown.out
    assert "3 succeeded" in shown.out

    listed = stack.awp("run", "list", "--workflow", "cli-watch", "--state", "succeeded", "--json")
    assert [r["id"] for r in listed.json()["runs"]] == [run_id]
    none = stack.awp("run", "list", "--workflow", "cli-watch", "--state", "failed")
    assert none.code == 0 and "no runs match" in none.out
    table = stack.awp("run", "list", "--limit", "5")
    assert table.code == 0 and run_id in table.out


def test_cancel_a_running_run(stack: DevStack, tmp_path: Path) -> None:
    slow = write(
        tmp_path,
        "slow.yaml",
        "name: cli-slow\ntasks: [{key: nap, kind: mock, action: noop, input: {sleep_ms: 60000}}]\n",
    )
    assert stack.awp("workflow", "apply", str(slow)).code == 0
    run_id = stack.awp("run", "start", "cli-slow", "--json").json()["run"]["id"]
    canceled = stack.awp("run", "cancel", run_id, "--reason", "test", "--wait", "--json")
    assert canceled.code == 0, canceled.err
    assert canceled.json()["run"]["state"] == "RUN_STATE_CANCELED"
    watched = stack.awp("run", "watch", run_id)
    assert watched.code == 1  # the run did not succeed
    assert "cancel requested: test" in watched.out
    again = stack.awp("run", "cancel", run_id)
    assert again.code == 0 and "is canceled" in again.out


def test_workers_and_stats(stack: DevStack) -> None:
    workers = stack.awp("workers", "--json").json()["workers"]
    assert sorted(w["name"] for w in workers) == ["dev-worker-1", "dev-worker-2"]
    assert all(w["state"] == "WORKER_STATE_ACTIVE" for w in workers)
    assert all(w["executorKinds"] == ["mock", "python"] for w in workers)
    table = stack.awp("workers", "--all")
    assert table.code == 0 and "dev-worker-1" in table.out
    stats = stack.awp("stats", "--json").json()
    assert {c["state"] for c in stats["workersByState"]} >= {"WORKER_STATE_ACTIVE"}
    shown = stack.awp("stats")
    assert shown.code == 0 and "active leases" in shown.out
    assert re.search(r"workers\s+active\s+\d+", shown.out)


def test_server_counters_move_during_a_run(stack: DevStack, tmp_path: Path) -> None:
    def counters() -> dict[str, float]:
        with urllib.request.urlopen(stack.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        return totals

    before = counters()
    assert "awp_database_up" in before
    path = write(tmp_path, "w.yaml", FLAKY.format(name="cli-metrics"))
    assert stack.awp("workflow", "apply", str(path)).code == 0
    assert stack.awp("run", "start", "cli-metrics", "--wait").code == 0
    after = counters()
    # Three tasks, one retried: four attempts claimed and four results reported at least.
    assert after["awp_leases_issued_total"] - before.get("awp_leases_issued_total", 0) >= 4
    assert after["awp_complete_results_total"] - before.get("awp_complete_results_total", 0) >= 4
    assert after["awp_claims_total"] > before.get("awp_claims_total", 0)


def test_awp_dev_serves_the_console_with_its_metrics(stack: DevStack) -> None:
    # No credentials on `awp dev`: no sign-in, and the overview reads both processes' metrics.
    with urllib.request.urlopen(stack.console_url + "/", timeout=30) as answer:
        page = answer.read().decode()
    assert "no credentials required" in page
    assert "from 2 metrics endpoints" in page
    assert "dev-worker-1" in page


# ---------------------------------------------------------------- errors


def one_error_line(result: Result) -> str:
    assert "Traceback" not in result.err + result.out
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    return lines[0]


def test_server_down_is_exit_3_in_one_line() -> None:
    address = f"127.0.0.1:{free_port()}"
    result = awp("--address", address, "--timeout", "5", "workflow", "list")
    assert result.code == 3
    assert one_error_line(result).startswith(f"awp: cannot reach awp-server at {address}: ")


def test_unknown_workflow_is_exit_2_with_its_reason(stack: DevStack) -> None:
    result = stack.awp("run", "start", "no-such-workflow")
    assert result.code == 2
    assert one_error_line(result).startswith("awp: WORKFLOW_NOT_FOUND: ")
    missing = stack.awp("run", "get", "00000000-0000-0000-0000-000000000000")
    assert missing.code == 2 and "RUN_NOT_FOUND" in missing.err


def test_bad_workflow_files_name_the_file_and_line(stack: DevStack, tmp_path: Path) -> None:
    broken = write(tmp_path, "broken.yaml", "name: x\ntasks:\n  - key: a\n    kind: [mock\n")
    result = stack.awp("workflow", "apply", str(broken))
    assert result.code == 2
    assert re.match(
        rf"awp: {re.escape(str(broken))}:\d+:\d+: invalid YAML: ", one_error_line(result)
    )

    shaped = write(
        tmp_path,
        "shaped.yaml",
        "name: x\ntasks:\n  - key: a\n    kind: mock\n    action: noop\n"
        "    timeout: soon\n    depends-on: [b]\n",
    )
    result = stack.awp("workflow", "apply", str(shaped))
    assert result.code == 2
    assert f"{shaped}:6: tasks[0].timeout: expected a duration" in result.err
    assert (
        f"{shaped}:7: tasks[0].depends-on: unknown field 'depends-on' (did you mean 'depends_on'?)"
        in result.err
    )

    # The server's own rules (checked before any call) name fields, mapped to lines too.
    cyclic = write(
        tmp_path,
        "cyclic.yaml",
        "name: cli-cyclic\ntasks:\n"
        "  - {key: a, kind: mock, action: noop, depends_on: [b]}\n"
        "  - {key: b, kind: mock, action: noop, depends_on: [c]}\n",
    )
    result = stack.awp("workflow", "apply", str(cyclic))
    assert result.code == 2
    assert "INVALID_DEFINITION" in result.err
    assert f"{cyclic}:4: tasks[1].depends_on[0]: unknown task 'c'" in result.err
    assert "Traceback" not in result.err

    missing = stack.awp("workflow", "apply", str(tmp_path / "nope.yaml"))
    assert missing.code == 2 and "nope.yaml" in one_error_line(missing)


def test_bad_input_json_is_a_usage_error(stack: DevStack) -> None:
    result = stack.awp("run", "start", "cli-ok", "--input", "{not json")
    assert result.code == 2
    assert "--input" in result.err and "not valid JSON" in result.err
    assert "Traceback" not in result.err
