"""The session's lifecycle: the allowed moves, and waiting for a condition or a call."""

from __future__ import annotations

import asyncio

import pytest

from awp_worker._lifecycle import Lifecycle, State

# Every move the lifecycle allows; any other pair is refused.
ALLOWED = {
    (State.STARTING, State.ACTIVE),
    (State.STARTING, State.DRAINING),
    (State.STARTING, State.STOPPED),
    (State.ACTIVE, State.DRAINING),
    (State.ACTIVE, State.HANDING_BACK),
    (State.ACTIVE, State.STOPPED),
    (State.DRAINING, State.HANDING_BACK),
    (State.DRAINING, State.STOPPED),
    (State.HANDING_BACK, State.STOPPED),
}


def at(state: State) -> Lifecycle:
    """A lifecycle brought to ``state`` by allowed moves."""
    lifecycle = Lifecycle()
    path = {
        State.STARTING: [],
        State.ACTIVE: [State.ACTIVE],
        State.DRAINING: [State.ACTIVE, State.DRAINING],
        State.HANDING_BACK: [State.ACTIVE, State.HANDING_BACK],
        State.STOPPED: [State.STOPPED],
    }[state]
    for step in path:
        assert lifecycle.move(step)
    return lifecycle


@pytest.mark.parametrize("source", list(State))
@pytest.mark.parametrize("target", list(State))
def test_only_the_listed_moves_are_allowed(source: State, target: State) -> None:
    lifecycle = at(source)
    moved = lifecycle.move(target)
    assert moved == ((source, target) in ALLOWED)
    assert lifecycle.state is (target if moved else source)


async def test_waiters_wake_on_a_notify_and_recheck_their_condition() -> None:
    lifecycle = Lifecycle()
    flag: list[bool] = []
    waiter = asyncio.create_task(lifecycle.wait_until(lambda: bool(flag)))
    await asyncio.sleep(0)
    lifecycle.notify()  # the condition does not hold yet: it keeps waiting
    await asyncio.sleep(0)
    assert not waiter.done()
    flag.append(True)
    lifecycle.notify()
    async with asyncio.timeout(1):
        assert await waiter is True


async def test_a_wait_gives_up_after_its_time() -> None:
    lifecycle = Lifecycle()
    assert await lifecycle.wait_until(lambda: False, within=0.01) is False
    assert await lifecycle.wait_until(lambda: True, within=0) is True


async def test_a_call_runs_while_the_state_lasts_and_is_cancelled_when_it_moves() -> None:
    lifecycle = Lifecycle()

    async def answer() -> int:
        return 42

    assert await lifecycle.while_in(State.STARTING, answer(), name="quick") == 42
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hang() -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return 0

    call = asyncio.create_task(lifecycle.while_in(State.STARTING, hang(), name="slow"))
    await started.wait()
    lifecycle.move(State.DRAINING)
    async with asyncio.timeout(1):
        assert await call is None
    assert cancelled.is_set()


async def test_a_calls_error_propagates() -> None:
    lifecycle = Lifecycle()

    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await lifecycle.while_in(State.STARTING, fail(), name="fail")
