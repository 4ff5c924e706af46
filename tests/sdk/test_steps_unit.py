"""ctx.step and the replay core without a server (awp_sdk.testing keeps the memos): a
step runs once across runs, a replay hands back the stored value and counts what it
saved, occurrences follow the action's order, a raising step is not memoised, bad
results and bad usage are refused naming the problem. The worker's store is exercised
end to end in tests/worker/test_steps.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from awp_protocol.limits import MAX_MEMO_BYTES
from awp_sdk import ActionCancelled, ActionContext, PermanentError
from awp_sdk.replay import Checkpoint, Usage
from awp_sdk.steps import step
from awp_sdk.testing import ActionEnvironment

calls: list[str] = []


def _model(prompt: str) -> dict[str, Any]:
    calls.append(prompt)
    return {"text": prompt.upper(), "tokens": len(prompt)}


def sync_action(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    first = ctx.step("call", _model, "ab", usage=lambda r: {"tokens": r["tokens"]})
    second = ctx.step("call", _model, "cde", usage={"tokens": 3, "cost_usd": 0.5})
    if input.get("crash"):
        raise RuntimeError("crashed after two steps")
    third = ctx.step("final", _model, "f")
    return {"texts": [first["text"], second["text"], third["text"]]}


async def _amodel(prompt: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _model(prompt)


async def async_action(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
    first = await ctx.step("call", _amodel, "ab", usage={"tokens": 2})
    second = await ctx.step("sync-fn", _model, "xy")
    if input.get("crash"):
        raise RuntimeError("crashed after two steps")
    return {"texts": [first["text"], second["text"]]}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    calls.clear()


def test_a_sync_action_replays_its_steps_and_counts_what_they_saved() -> None:
    env = ActionEnvironment()
    with pytest.raises(RuntimeError, match="crashed"):
        env.run(sync_action, {"crash": True})
    assert calls == ["ab", "cde"]
    assert [(c.name, c.occurrence) for c in env.checkpoints] == [("call", 0), ("call", 1)]
    assert env.checkpoints[0].usage == Usage(2, 0.0)

    calls.clear()
    assert env.run(sync_action) == {"texts": ["AB", "CDE", "F"]}
    assert calls == ["f"]  # only the step no attempt had finished
    assert (env.savings.steps, env.savings.tokens, env.savings.cost_usd) == (2, 5, 0.5)


def test_an_async_action_awaits_its_steps_sync_and_async_functions_alike() -> None:
    env = ActionEnvironment()
    with pytest.raises(RuntimeError):
        env.run(async_action, {"crash": True})
    calls.clear()
    assert env.run(async_action) == {"texts": ["AB", "XY"]}
    assert calls == []
    assert env.savings.steps == 2 and env.savings.tokens == 2


def test_a_step_returns_its_value_as_stored_on_the_first_run_too() -> None:
    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"got": ctx.step("pair", lambda: (1, 2))}

    env = ActionEnvironment()
    assert env.run(act) == {"got": [1, 2]}
    assert env.checkpoints[0].value == [1, 2]


def test_a_step_that_raises_is_not_memoised() -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("model overloaded")
        return "ok"

    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"got": ctx.step("flaky", flaky)}

    env = ActionEnvironment()
    with pytest.raises(ValueError, match="overloaded"):
        env.run(act)
    assert env.checkpoints == []
    assert env.run(act) == {"got": "ok"}
    assert len(attempts) == 2


@step("decorated", usage=lambda r: {"tokens": r})
def decorated(n: int) -> int:
    calls.append(f"decorated {n}")
    return n * 10


def test_the_decorator_form_memoises_by_the_steps_name() -> None:
    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"a": decorated(1), "b": decorated(2)}

    env = ActionEnvironment()
    assert env.run(act) == {"a": 10, "b": 20}
    assert env.run(act) == {"a": 10, "b": 20}
    assert calls == ["decorated 1", "decorated 2"]
    assert env.savings.tokens == 30


def test_outside_an_action_a_decorated_step_says_so() -> None:
    with pytest.raises(RuntimeError, match="inside an action"):
        decorated(1)


@pytest.mark.parametrize(
    ("fn", "usage", "message"),
    [
        (lambda: {1, 2}, None, "not JSON"),
        (lambda: float("nan"), None, "not JSON"),
        (lambda: "x" * (MAX_MEMO_BYTES + 1), None, "memo size limit"),
        (lambda: 1, {"tokens": -1}, "tokens must be an integer >= 0"),
        (lambda: 1, {"cost_usd": float("inf")}, "cost_usd must be a finite number"),
        (lambda: 1, {"dollars": 1}, "not dollars"),
    ],
)
def test_a_result_or_usage_that_cannot_be_stored_fails_the_task_for_good(
    fn: Any, usage: Any, message: str
) -> None:
    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"got": ctx.step("bad", fn, usage=usage)}

    env = ActionEnvironment()
    with pytest.raises(PermanentError, match=message):
        env.run(act)
    assert env.checkpoints == []


def test_a_bad_step_name_is_refused_naming_the_rule() -> None:
    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        return {"got": ctx.step("no spaces", lambda: 1)}

    with pytest.raises(ValueError, match="invalid step name 'no spaces'"):
        ActionEnvironment().run(act)


def test_memos_stored_by_an_earlier_attempt_are_replayed_by_occurrence() -> None:
    env = ActionEnvironment()
    env.checkpoints.append(Checkpoint("step", "call", 1, {"text": "STORED", "tokens": 0}))

    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        a = ctx.step("call", _model, "first")
        b = ctx.step("call", _model, "second")
        return {"a": a["text"], "b": b["text"]}

    assert env.run(act) == {"a": "FIRST", "b": "STORED"}
    assert calls == ["first"]


def test_a_cancelled_attempt_runs_no_further_step() -> None:
    env = ActionEnvironment()

    def act(ctx: ActionContext, input: dict[str, Any]) -> dict[str, Any]:
        ctx.step("call", _model, "paid")
        env.cancel()  # as a revoked lease does
        ctx.step("call", _model, "never")
        return {}

    with pytest.raises(ActionCancelled):
        env.run(act)
    assert calls == ["paid"]
