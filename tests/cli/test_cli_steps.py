"""What step memos save, by the command line against one `awp dev` stack: a task whose
first attempt failed after two checkpointed model calls runs them once, and `awp run
get` shows the two steps, their tokens and cost as saved, for the task and the run."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from awp_sdk import Client
from cli.devstack import DevStack, dev_stack
from cli.durable_actions import agent


@pytest.fixture(scope="module")
def stack() -> Iterator[DevStack]:
    yield from dev_stack(["cli.durable_actions"])


def test_run_get_shows_what_the_memos_of_a_retried_task_saved(stack: DevStack) -> None:
    with Client(stack.address) as client:
        client.apply(agent)
    started = stack.awp("run", "start", "cli-agent", "--wait", timeout=120)
    assert started.code == 0, started.out + started.err
    run_id = re.search(r"started run (\S+)", started.out)
    assert run_id, started.out
    shown = stack.awp("run", "get", run_id[1])
    assert shown.code == 0, shown.err
    # outline: 1000 + 17 tokens; draft: 1000 + 17 again (the outline's text, upper-cased).
    assert "memos saved: 2 steps, 2,034 tokens, $0.0300 not run again" in shown.out, shown.out
    assert re.search(r"write: 2 steps, 2,034 tokens, \$0\.0300 not run again", shown.out)
    assert re.search(r"write\s+succeeded\s.*\s2/2\s", shown.out), shown.out
    got = stack.awp("run", "get", run_id[1], "--json").json()
    (task,) = got["tasks"]
    assert task["saved"] == {"steps": 2, "tokens": "2034", "costUsd": 0.03}
