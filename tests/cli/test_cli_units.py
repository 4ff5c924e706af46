"""Client-side pieces without a server: exit codes of statuses, paging, argument types."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import grpc
import pytest

from awp.v1 import control_pb2
from awp_cli import commands
from awp_cli.client import failure
from awp_cli.dev import command as dev
from awp_cli.errors import Exit


class Failed(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


S = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "exit_code", "message"),
    [
        (S.UNAVAILABLE, Exit.SERVER, "cannot reach awp-server at h:1: down now"),
        (S.DEADLINE_EXCEEDED, Exit.SERVER, "awp-server at h:1 did not answer in time"),
        (S.UNIMPLEMENTED, Exit.SERVER, "h:1 does not serve awp.v1.ControlService (down now)"),
        (S.INVALID_ARGUMENT, Exit.USAGE, "INVALID_ARGUMENT: down now"),
        (S.INTERNAL, Exit.SERVER, "INTERNAL: down now"),
    ],
)
def test_statuses_without_error_info(code: grpc.StatusCode, exit_code: Exit, message: str) -> None:
    # No ErrorInfo: the answer came from the transport or a proxy, not from AWP.
    error = failure(Failed(code, "down\n now"), "h:1")
    assert (error.code, error.message) == (exit_code, message)


async def test_pages_are_followed_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "MAX_PAGE", 2)
    runs = [control_pb2.Run(id=str(i)) for i in range(5)]
    asked: list[tuple[int, str]] = []

    class FakeClient:
        async def call(self, _method: Any, request: control_pb2.ListRunsRequest) -> Any:
            asked.append((request.page_size, request.page_token))
            start = int(request.page_token or 0)
            end = start + request.page_size
            return control_pb2.ListRunsResponse(
                runs=runs[start:end], next_page_token=str(end) if end < len(runs) else ""
            )

    request = control_pb2.ListRunsRequest()
    answer = await commands._all_pages(FakeClient(), None, request, "runs", 3)  # type: ignore[arg-type]
    assert [r.id for r in answer.runs] == ["0", "1", "2"]
    assert answer.next_page_token == "3"  # where a script would go on
    assert asked == [(2, ""), (1, "2")]
    everything = await commands._all_pages(
        FakeClient(),  # type: ignore[arg-type]
        None,
        control_pb2.ListRunsRequest(),
        "runs",
        100,
    )
    assert len(everything.runs) == 5 and not everything.next_page_token


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
