"""Failures you can debug and runs you can resume, end to end: `awp dev` (real PostgreSQL,
server, coordinator, two worker processes) running the actions of cli.debug_actions,
driven with the awp CLI as a user would."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from awp_protocol.limits import MAX_LOG_TAIL_CHARS, MAX_LOG_TAIL_LINES, MAX_TRACEBACK_CHARS
from cli.devstack import DevStack, dev_stack

PIPELINE = """\
name: {name}
tasks:
  - {{key: fetch, kind: python, action: debug.fetch}}
  - {{key: side, kind: python, action: debug.fetch}}
  - key: parse
    kind: python
    action: debug.parse
    depends_on: [fetch, side]
    retry: {{max_attempts: 1}}
  - {{key: publish, kind: python, action: debug.publish, depends_on: [parse]}}
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    yield from dev_stack(["cli.debug_actions"])


class Pipeline:
    """One workflow of PIPELINE, its runs' input, and the executions they recorded."""

    def __init__(self, stack: DevStack, tmp_path: Path, name: str) -> None:
        self.stack = stack
        self.name = name
        self.count_file = tmp_path / "executions.txt"
        self.count_file.touch()
        self.fail_marker = tmp_path / "fail"
        self.fail_marker.touch()
        path = tmp_path / f"{name}.yaml"
        path.write_text(PIPELINE.format(name=name))
        applied = stack.awp("workflow", "apply", str(path))
        assert applied.code == 0, applied.err

    def start_failing(self) -> str:
        """A run whose parse raises KeyError('missing'): fetch and side succeed first."""
        run_input = json.dumps(
            {"count_file": str(self.count_file), "fail_marker": str(self.fail_marker)}
        )
        started = self.stack.awp("run", "start", self.name, "--input", run_input, "--wait")
        assert started.code == 1, started.out + started.err
        assert "failed:   parse: KeyError: 'missing'" in started.out
        return re.search(r"started run (\S+)", started.out)[1]  # type: ignore[index]

    def executions(self) -> Counter[str]:
        return Counter(line.split()[0] for line in self.count_file.read_text().splitlines())


def test_a_failing_action_shows_its_traceback_and_log_tail(stack: DevStack, tmp_path: Path) -> None:
    pipeline = Pipeline(stack, tmp_path, "debug-keyerror")
    run_id = pipeline.start_failing()

    shown = stack.awp("run", "get", run_id)
    assert shown.code == 0, shown.err
    out = shown.out
    print(out)
    assert "task parse failed: KeyError: 'missing'" in out
    assert "Traceback (most recent call last):" in out
    assert re.search(r'File ".*debug_actions\.py", line \d+, in parse', out)
    assert 'return {"value": record["missing"]}' in out
    assert "awp_worker" not in out  # the worker's own frames are left out
    assert f"awp logs {run_id} parse" in out

    logs = stack.awp("logs", run_id, "parse")
    assert logs.code == 0, logs.err
    print(logs.out)
    assert "parse attempt 1  failed" in logs.out and "dev-worker-" in logs.out
    assert "error: KeyError: 'missing'  [retryable]" in logs.out
    assert 'record["missing"]' in logs.out
    tail = logs.out.split("log tail:", 1)[1]
    assert "INFO awp_worker.action: parsing 3 records" in tail
    assert "print from parse" in tail

    every = stack.awp("logs", run_id, "--json").json()["attempts"]
    assert sorted(a["taskKey"] for a in every) == ["fetch", "parse", "side"]

    listed = stack.awp("run", "tasks", run_id)
    assert listed.code == 0, listed.err
    assert "parse" in listed.out and "KeyError: 'missing'" in listed.out
    tasks = stack.awp("run", "tasks", run_id, "--json").json()["tasks"]
    assert {t["key"]: t["state"] for t in tasks}["parse"] == "TASK_STATE_FAILED"
    [parse] = [a for a in every if a["taskKey"] == "parse"]
    assert parse["error"]["type"] == "KeyError"
    assert parse["error"]["traceback"].endswith("KeyError: 'missing'\n")

    # The worker's own log line has the traceback and the attempt's fields.
    line = next(
        (
            line
            for line in stack.worker_logs().splitlines()
            if f"run_id={run_id}" in line and "failed (retryable)" in line
        ),
        None,
    )
    assert line is not None, stack.worker_logs()[-5000:]
    assert "failed (retryable): KeyError: 'missing'" in line
    for field in ("task_key=parse", "attempt=1", "worker_id="):
        assert field in line
    after = stack.worker_logs().split(line, 1)[1]
    assert after.lstrip("\n").startswith("Traceback (most recent call last):")
    assert 'record["missing"]' in after.split("KeyError: 'missing'", 1)[0]


def test_a_retry_runs_only_what_failed_and_reuses_the_rest(stack: DevStack, tmp_path: Path) -> None:
    pipeline = Pipeline(stack, tmp_path, "debug-retry")
    source = pipeline.start_failing()
    assert pipeline.executions() == {"fetch": 1, "side": 1, "parse": 1}

    pipeline.fail_marker.unlink()  # the bug is fixed
    retried = stack.awp("run", "retry", source, "--wait")
    assert retried.code == 0, retried.out + retried.err
    print(retried.out)
    assert f"a retry of run {source}: 2 tasks reused, 2 to run" in retried.out
    assert "reused:   fetch, side (not run again)" in retried.out
    new = re.search(r"started run (\S+),", retried.out)[1]  # type: ignore[index]
    # The reused actions did not execute again; only the failed one and its dependent did.
    assert pipeline.executions() == {"fetch": 1, "side": 1, "parse": 2, "publish": 1}

    got = stack.awp("run", "get", new, "--json").json()
    assert got["run"]["retriedFromRunId"] == source
    tasks = {t["key"]: t for t in got["tasks"]}
    assert tasks["fetch"]["reusedFromRunId"] == source and "attempts" not in tasks["fetch"]
    # The dependents received the reused output exactly as before: fetched in the source.
    assert tasks["publish"]["output"] == {"published": 3, "fetched_in": source}
    shown = stack.awp("run", "get", new).out
    assert f"retried from run {source}" in shown and f"reused {source[:8]}" in shown
    why = stack.awp("logs", new, "fetch").out
    assert f"reused the output of run {source}" in why

    # --from re-runs that task and everything downstream, even though they succeeded.
    again = stack.awp("run", "retry", new, "--from", "parse", "--wait")
    assert again.code == 0, again.out + again.err
    assert "2 tasks reused, 2 to run" in again.out
    assert pipeline.executions() == {"fetch": 1, "side": 1, "parse": 3, "publish": 2}
    third = re.search(r"started run (\S+),", again.out)[1]  # type: ignore[index]
    third_tasks = {t["key"]: t for t in stack.awp("run", "get", third, "--json").json()["tasks"]}
    # A chain of retries names the run that produced each reused output.
    assert third_tasks["fetch"]["reusedFromRunId"] == source

    unknown = stack.awp("run", "retry", new, "--from", "nope")
    assert unknown.code == 2
    assert "from_task" in unknown.err and "has no task 'nope'" in unknown.err

    # One request id, one retry.
    first = stack.awp("run", "retry", source, "--request-id", "fix-1", "--json").json()
    repeat = stack.awp("run", "retry", source, "--request-id", "fix-1")
    assert first["created"] is True
    assert f"run {first['run']['id']} was already started with request id" in repeat.out


def test_a_live_run_cannot_be_retried(stack: DevStack, tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text(
        "name: debug-slow\ntasks:\n  - {key: nap, kind: mock, action: noop, "
        "input: {sleep_ms: 60000}}\n"
    )
    assert stack.awp("workflow", "apply", str(path)).code == 0
    run_id = stack.awp("run", "start", "debug-slow", "--json").json()["run"]["id"]
    refused = stack.awp("run", "retry", run_id)
    assert refused.code == 2, refused.out + refused.err
    assert f"RUN_NOT_FINISHED: run {run_id} is still running" in refused.err
    assert stack.awp("run", "cancel", run_id, "--wait").code == 0


@pytest.mark.parametrize(
    ("lines", "width", "depth"),
    [(120, 10, 400), (60, 300, 10)],
    ids=["many-short-lines-deep-stack", "long-lines"],
)
def test_traceback_and_log_tail_are_cut_at_their_bounds(
    stack: DevStack, tmp_path: Path, lines: int, width: int, depth: int
) -> None:
    name = f"debug-noisy-{lines}"
    path = tmp_path / "noisy.yaml"
    path.write_text(
        f"name: {name}\ntasks:\n  - key: noisy\n    kind: python\n    action: debug.noisy\n"
        "    retry: {max_attempts: 1}\n"
    )
    assert stack.awp("workflow", "apply", str(path)).code == 0
    run_input = {"lines": lines, "width": width, "depth": depth}
    run = stack.awp("run", "start", name, "--input", json.dumps(run_input), "--wait", "--json")
    run_id = run.json()["run"]["id"]
    [attempt] = stack.awp("logs", run_id, "noisy", "--json").json()["attempts"]
    error = attempt["error"]
    traceback, tail = error["traceback"], error["logTail"]
    print(f"FIGURES traceback={len(traceback)} chars, log tail={len(tail)} chars, "
          f"{len(tail.splitlines())} lines")  # fmt: skip
    assert traceback.endswith("ValueError: the bottom of a deep stack\n")
    assert len(traceback) <= MAX_TRACEBACK_CHARS
    if depth > 100:
        # Cut from the outside in: its first line, what was cut, the innermost frames.
        assert len(traceback) > MAX_TRACEBACK_CHARS - 200
        first, cut = traceback.splitlines()[:2]
        assert first == "Traceback (most recent call last):"
        assert re.fullmatch(r"  \.\.\. \[\d+ characters of outer frames cut\]", cut)
    tail_lines = tail.splitlines()
    assert len(tail_lines) <= MAX_LOG_TAIL_LINES and len(tail) <= MAX_LOG_TAIL_CHARS
    assert tail_lines[-1].endswith(f"line {lines - 1:03d} {'x' * width}")  # the newest kept
    assert all(" WARNING debug_actions: line " in line for line in tail_lines)  # whole lines
    if width * MAX_LOG_TAIL_LINES < MAX_LOG_TAIL_CHARS:
        assert len(tail_lines) == MAX_LOG_TAIL_LINES
    else:
        assert len(tail) > MAX_LOG_TAIL_CHARS - 2 * width
