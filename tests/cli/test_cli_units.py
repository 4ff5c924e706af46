"""Client-side pieces without a server: exit codes of statuses, paging, argument types,
how typed states are shown."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from rich.console import Console

from awp.v1 import control_pb2, durable_pb2, runs_pb2, types_pb2
from awp_cli import commands, render
from awp_cli.dev import command as dev
from awp_cli.errors import Exit, exit_error
from awp_cli.event_view import event_line
from awp_cli.render_fleet import stats_view, workers_table
from awp_cli.render_runs import run_view, task_counts
from awp_cli.render_tasks import tasks_table
from awp_sdk import decode
from awp_sdk.enums import EventType, TaskState
from awp_sdk.errors import START_HINT, UnknownEnumValue, from_rpc_error
from awp_sdk.records import Event, Page, RunDecision


class Failed(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


S = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "exit_code", "message"),
    [
        (S.UNAVAILABLE, Exit.SERVER, f"cannot reach awp-server at h:1: down now; {START_HINT}"),
        (S.DEADLINE_EXCEEDED, Exit.SERVER, "awp-server at h:1 did not answer in time"),
        (S.UNIMPLEMENTED, Exit.SERVER, "h:1 does not serve awp.v1.ControlService (down now)"),
        (S.INVALID_ARGUMENT, Exit.USAGE, "INVALID_ARGUMENT: down now"),
        (S.INTERNAL, Exit.SERVER, "INTERNAL: down now"),
    ],
)
def test_statuses_without_error_info(code: grpc.StatusCode, exit_code: Exit, message: str) -> None:
    # No ErrorInfo: the answer came from the transport or a proxy, not from AWP.
    error = exit_error(from_rpc_error(Failed(code, "down\n now"), "h:1"))
    assert (error.code, error.message) == (exit_code, message)


async def test_pages_are_followed_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "MAX_PAGE", 2)
    runs = [str(i) for i in range(5)]
    asked: list[tuple[int, str]] = []

    async def page(token: str, size: int) -> Page[str]:
        asked.append((size, token))
        start = int(token or 0)
        end = start + size
        return Page(tuple(runs[start:end]), str(end) if end < len(runs) else "")

    found, token = await commands.first_items(page, 3)
    assert found == ["0", "1", "2"]
    assert token == "3"  # where a script would go on
    assert asked == [(2, ""), (1, "2")]
    everything, token = await commands.first_items(page, 100)
    assert len(everything) == 5 and not token


def test_argument_types() -> None:
    assert commands.workflow_ref("digest") == ("digest", 0)
    assert commands.workflow_ref("digest@3") == ("digest", 3)
    for bad in ("digest@", "@3", "digest@x"):
        with pytest.raises(argparse.ArgumentTypeError):
            commands.workflow_ref(bad)
    assert commands.json_object('{"n": 1}')["n"] == 1
    for bad, problem in (("[1]", "must be a JSON object"), ("{", "not valid JSON")):
        with pytest.raises(argparse.ArgumentTypeError, match=problem):
            commands.json_object(bad)


@pytest.mark.parametrize(
    ("xdg", "euid", "expected"),
    [
        ("/data", 0, "/data/awp/dev"),
        (None, 1000, "~/.local/share/awp/dev"),
        # PostgreSQL's own user must traverse every parent: never under /root.
        (None, 0, "/var/lib/awp/dev"),
    ],
)
def test_default_data_dir(
    monkeypatch: pytest.MonkeyPatch, xdg: str | None, euid: int, expected: str
) -> None:
    if xdg is None:
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_DATA_HOME", xdg)
    monkeypatch.setattr(dev.os, "geteuid", lambda: euid)
    assert dev.default_data_dir() == Path(expected).expanduser()


def test_typed_counts_are_shown_by_state_name() -> None:
    run = runs_pb2.Run(
        state=types_pb2.RUN_STATE_RUNNING,
        tasks_by_state=[
            runs_pb2.TaskStateCount(state=types_pb2.TASK_STATE_PENDING, count=2),
            runs_pb2.TaskStateCount(state=types_pb2.TASK_STATE_WAITING_RETRY, count=1),
        ],
    )
    assert task_counts(decode.run(run)) == {"pending": 2, "waiting_retry": 1}
    assert render.counts_text(task_counts(decode.run(run))).plain == "2 pending · 1 waiting_retry"

    answer = control_pb2.GetStatsResponse
    stats = answer(
        tasks_by_state=[
            answer.TaskCount(state=types_pb2.TASK_STATE_QUEUED, executor_kind="python", count=3)
        ],
        dispatches_by_state=[
            answer.DispatchCount(
                state=types_pb2.DISPATCH_STATE_LEASED, executor_kind="mock", count=1
            )
        ],
        runs_by_state=[answer.RunCount(state=types_pb2.RUN_STATE_CANCELED, count=4)],
        workers_by_state=[answer.WorkerCount(state=types_pb2.WORKER_STATE_DRAINING, count=5)],
        active_leases=1,
    )
    console = Console(record=True, width=120)
    console.print(stats_view(decode.stats(stats)))
    shown = console.export_text()
    for row in (
        r"runs\s+canceled\s+4",
        r"tasks of running runs\s+queued\s+python\s+3",
        r"dispatches\s+leased\s+mock\s+1",
        r"workers\s+draining\s+5",
    ):
        assert re.search(row, shown), (row, shown)
    # A state a newer server knows and this CLI does not is refused, never misnamed: the
    # SDK's one enum mapping (awp_sdk.enums) says which value to upgrade for.
    stats.workers_by_state[0].state = types_pb2.WorkerState.ValueType(9)
    with pytest.raises(UnknownEnumValue, match=r"awp\.v1\.WorkerState value 9"):
        decode.stats(stats)


def test_awp_workers_shows_labels_models_and_resources_reserved_of_capacity() -> None:
    info = control_pb2.WorkerInfo(
        id="w-1",
        name="gpu-box",
        state=types_pb2.WORKER_STATE_ACTIVE,
        executor_kinds=["mock"],
        max_concurrency=4,
        active_leases=1,
        labels={"gpu": "a100"},
        models=["llama3-8b"],
        resources={"gpu": 2, "vram_gb": 80},
        reserved={"gpu": 1, "vram_gb": 0},
    )
    console = Console(record=True, width=200)
    console.print(workers_table([decode.worker(info)]))
    shown = console.export_text()
    assert re.search(r"gpu=a100,model=llama3-8b\s+gpu 1/2, vram_gb 0/80", shown), shown


def test_attempts_shown_charged_of_allowed_with_hand_backs_apart() -> None:
    answer = runs_pb2.GetRunResponse(
        run=runs_pb2.Run(state=types_pb2.RUN_STATE_RUNNING),
        tasks=[
            runs_pb2.Task(
                key="plain", state=types_pb2.TASK_STATE_RUNNING, attempts=2, max_attempts=3
            ),
            runs_pb2.Task(
                key="handed",
                state=types_pb2.TASK_STATE_RUNNING,
                attempts=3,
                max_attempts=1,
                hand_backs=2,
            ),
        ],
    )
    console = Console(record=True, width=120)
    console.print(tasks_table(decode.run_detail(answer)))
    shown = console.export_text()
    assert re.search(r"plain\s.*\s2/3\s", shown), shown
    assert re.search(r"handed\s.*\s1/1 \+2 handed back", shown), shown


def test_run_get_collapses_a_map_tasks_elements() -> None:
    tasks = [
        runs_pb2.Task(key="plan", state=types_pb2.TASK_STATE_SUCCEEDED, attempts=1),
        runs_pb2.Task(
            key="search",
            state=types_pb2.TASK_STATE_FAILED,
            error=types_pb2.TaskError(message="element 2 (search[2]) failed: no"),
        ),
        *(
            runs_pb2.Task(
                key=f"search[{i}]",
                state=state,
                attempts=1,
                max_attempts=3,
                map_parent="search",
                map_index=i,
                error=types_pb2.TaskError(message="no") if i == 2 else None,
            )
            for i, state in enumerate(
                [
                    types_pb2.TASK_STATE_SUCCEEDED,
                    types_pb2.TASK_STATE_SUCCEEDED,
                    types_pb2.TASK_STATE_FAILED,
                    types_pb2.TASK_STATE_CANCELED,
                ]
            )
        ),
    ]
    attempts = [
        runs_pb2.Attempt(
            task_key=task.key,
            attempt=1,
            state=types_pb2.ATTEMPT_STATE_FAILED
            if task.key == "search[2]"
            else types_pb2.ATTEMPT_STATE_SUCCEEDED,
            worker_id="w" * 36,
        )
        for task in tasks
        if task.attempts
    ]
    console = Console(record=True, width=200)
    run = runs_pb2.Run(id="r", state=types_pb2.RUN_STATE_FAILED)
    console.print(
        run_view(
            decode.run_detail(runs_pb2.GetRunResponse(run=run, tasks=tasks, attempts=attempts))
        )
    )
    text = console.export_text()
    assert "4 elements: 2 succeeded · 1 failed · 1 canceled" in text
    assert "  search[2]" in text  # the failed element, under its map task
    assert "search[0]" not in text and "search[3]" not in text
    assert "search[...]" in text and "2 succeeded" in text  # their attempts, collapsed


def test_run_get_shows_the_trace_and_its_link() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = runs_pb2.GetRunResponse(
        run=runs_pb2.Run(id="r", state=types_pb2.RUN_STATE_SUCCEEDED, trace_id=trace_id)
    )
    detail = decode.run_detail(answer)
    console = Console(record=True, width=160)
    console.print(run_view(detail, trace_url="http://jaeger:16686/trace/{trace_id}"))
    assert f"trace {trace_id}  http://jaeger:16686/trace/{trace_id}" in console.export_text()
    console = Console(record=True, width=160)
    console.print(run_view(detail))
    shown = console.export_text()
    assert f"trace {trace_id}" in shown and "http" not in shown
    untraced = decode.run_detail(
        runs_pb2.GetRunResponse(run=runs_pb2.Run(id="r", state=types_pb2.RUN_STATE_SUCCEEDED))
    )
    console = Console(record=True, width=160)
    console.print(run_view(untraced))
    assert "trace" not in console.export_text()


def test_run_get_shows_what_tasks_wait_for_and_what_memos_saved() -> None:
    since = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    answer = runs_pb2.GetRunResponse(
        run=runs_pb2.Run(id="r1", state=types_pb2.RUN_STATE_RUNNING),
        tasks=[
            runs_pb2.Task(
                key="review",
                state=types_pb2.TASK_STATE_WAITING,
                attempts=3,
                max_attempts=2,
                suspensions=2,
                wait=durable_pb2.TaskWait(
                    kind=types_pb2.CHECKPOINT_KIND_APPROVAL,
                    name="approval",
                    prompt="Publish the summary?",
                    role="admin",
                    since=since,
                    attempt=3,
                ),
                saved=types_pb2.MemoSavings(steps=2, tokens=1234, cost_usd=0.02),
            ),
            runs_pb2.Task(
                key="hook",
                state=types_pb2.TASK_STATE_WAITING,
                wait=durable_pb2.TaskWait(
                    kind=types_pb2.CHECKPOINT_KIND_SIGNAL, name="payment", since=since
                ),
                saved=types_pb2.MemoSavings(steps=1, tokens=100),
            ),
            runs_pb2.Task(key="done", state=types_pb2.TASK_STATE_SUCCEEDED, attempts=1),
        ],
    )
    console = Console(record=True, width=200)
    console.print(run_view(decode.run_detail(answer)))
    shown = console.export_text()
    # Suspensions are free: 1 of 2 charged, the 2 suspended said apart.
    assert re.search(r"review\s+waiting\s.*1/2 \+2 suspended\s+-\s+waits for approval", shown), (
        shown
    )
    assert re.search(
        r"review\s+approval 'approval' by admins\s.*never\s+3\s+Publish the summary\?", shown
    ), shown
    assert re.search(r"hook\s+signal 'payment'\s.*never\s+no worker", shown), shown
    assert "awp approve|reject r1 TASK" in shown
    assert "memos saved: 3 steps, 1,334 tokens, $0.0200 not run again" in shown
    assert re.search(r"review: 2 steps, 1,234 tokens, \$0.0200 not run again", shown), shown
    # The decisions made (the audit trail), as the run's events record them.
    at = datetime(2025, 1, 1, tzinfo=UTC)
    decided = [
        RunDecision("gate", True, "ada", "looks right", 2, at),
        RunDecision("sign", False, "root", "", None, at),
    ]
    console = Console(record=True, width=200)
    console.print(run_view(decode.run_detail(answer), decided))
    audit = console.export_text()
    assert re.search(r"gate  approved by ada at .*, resuming attempt 2: 'looks right'", audit), (
        audit
    )
    assert re.search(r"sign  rejected by root at [-0-9: ]+\n", audit), audit
    line = event_line(
        Event("r1", 7, 5, EventType.TASK_STATE, "gate", None, TaskState.WAITING, TaskState.READY,
              {"approved": True, "decided_by": "ada", "comment": "looks right"}, at)
    ).plain  # fmt: skip
    assert line.endswith("waiting -> ready  approved by ada: 'looks right'"), line
    # A run where nothing waits and no memo saved anything says nothing of either.
    plain = runs_pb2.GetRunResponse(run=answer.run, tasks=[answer.tasks[2]])
    console = Console(record=True, width=200)
    console.print(run_view(decode.run_detail(plain)))
    assert "waiting" not in console.export_text()
    assert "memos" not in console.export_text()


def test_a_signal_payload_is_any_json_value_inline_or_from_a_file(tmp_path: Path) -> None:
    assert commands.json_value("[1, 2]") == [1, 2]
    assert commands.json_value('"yes"') == "yes"
    assert commands.json_value("null") is None
    payload = tmp_path / "payload.json"
    payload.write_text('{"paid": 12}')
    assert commands.json_value(f"@{payload}") == {"paid": 12}
    with pytest.raises(argparse.ArgumentTypeError, match="not valid JSON"):
        commands.json_value("{")
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        commands.json_value(f"@{tmp_path / 'missing.json'}")
