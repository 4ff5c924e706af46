"""The retry rule: backoff growth and cap, and what an ended attempt does to its task."""

from __future__ import annotations

import time
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awp_kernel.retry import AttemptEnd, RetryPolicy, TaskDecision, decide, decide_hand_back
from awp_protocol.limits import (
    MAX_ATTEMPTS,
    MAX_BACKOFF_MULTIPLIER,
    MAX_DURATION_MS,
    MAX_FREE_HAND_BACKS,
)

PROPERTY = settings(max_examples=200, deadline=None)


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    """Any policy `validate` accepts."""
    initial = draw(st.integers(min_value=0, max_value=MAX_DURATION_MS))
    return RetryPolicy(
        max_attempts=draw(st.integers(min_value=1, max_value=MAX_ATTEMPTS)),
        initial_backoff_ms=initial,
        max_backoff_ms=draw(st.integers(min_value=initial, max_value=MAX_DURATION_MS)),
        multiplier=draw(st.floats(min_value=1.0, max_value=MAX_BACKOFF_MULTIPLIER)),
    )


# --- backoff -------------------------------------------------------------------------------


def test_default_policy() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff_ms, policy.max_backoff_ms) == (
        3,
        1_000,
        60_000,
    )
    assert policy.multiplier == 2.0


def test_backoff_doubles_then_caps() -> None:
    policy = RetryPolicy()
    delays = [policy.backoff_ms(n) for n in range(1, 10)]
    assert delays == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]


def test_backoff_other_multiplier() -> None:
    policy = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=10**6, multiplier=3.0)
    assert [policy.backoff_ms(n) for n in range(1, 5)] == [100, 300, 900, 2_700]


def test_multiplier_one_is_constant() -> None:
    policy = RetryPolicy(initial_backoff_ms=250, max_backoff_ms=1_000, multiplier=1.0)
    assert {policy.backoff_ms(n) for n in (1, 2, 50, 10**6, 10**400)} == {250}


def test_zero_initial_backoff_is_always_zero() -> None:
    policy = RetryPolicy(initial_backoff_ms=0, max_backoff_ms=1_000, multiplier=10.0)
    assert {policy.backoff_ms(n) for n in (1, 2, 100, 10**400)} == {0}


@pytest.mark.parametrize("attempt", [0, -1, -(10**20)])
def test_attempt_numbers_start_at_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="start at 1"):
        RetryPolicy().backoff_ms(attempt)


@pytest.mark.parametrize("attempt", [65, 1_000, 10**6, 10**18, 10**400])
@pytest.mark.parametrize("multiplier", [1.0001, 2.0, MAX_BACKOFF_MULTIPLIER, 2])
def test_huge_attempt_numbers_do_not_overflow(attempt: int, multiplier: float) -> None:
    policy = RetryPolicy(
        initial_backoff_ms=1, max_backoff_ms=MAX_DURATION_MS, multiplier=multiplier
    )
    started = time.perf_counter()
    delay = policy.backoff_ms(attempt)
    assert time.perf_counter() - started < 1.0
    assert isinstance(delay, int)
    assert 1 <= delay <= MAX_DURATION_MS
    if attempt >= 10**6:
        assert delay == MAX_DURATION_MS


def test_growth_continues_past_attempt_64_until_the_cap() -> None:
    # Regression: the exponent used to be clamped at 64, so a slow multiplier stopped
    # growing long before max_backoff (types.proto: min(initial * m^(n-1), max)).
    policy = RetryPolicy(
        max_attempts=MAX_ATTEMPTS,
        initial_backoff_ms=1_000,
        max_backoff_ms=MAX_DURATION_MS,
        multiplier=1.1,
    )
    assert policy.backoff_ms(66) > policy.backoff_ms(65)
    assert policy.backoff_ms(99) == int(1_000 * 1.1**98)


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=10**6))
def test_backoff_is_the_documented_formula(policy: RetryPolicy, attempt: int) -> None:
    delay = policy.backoff_ms(attempt)
    assert isinstance(delay, int)
    assert policy.initial_backoff_ms <= delay <= policy.max_backoff_ms
    try:
        growth = policy.multiplier ** (attempt - 1)
    except OverflowError:
        growth = float("inf")
    # 0 * inf is nan in floats, but 0 * m^n is 0.
    exact = policy.initial_backoff_ms * growth if policy.initial_backoff_ms else 0
    assert delay == int(min(exact, policy.max_backoff_ms))


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=200))
def test_backoff_never_shrinks(policy: RetryPolicy, attempt: int) -> None:
    assert policy.backoff_ms(attempt) <= policy.backoff_ms(attempt + 1)


@PROPERTY
@given(policies())
def test_first_backoff_is_the_initial_one(policy: RetryPolicy) -> None:
    assert policy.backoff_ms(1) == policy.initial_backoff_ms


# --- decide --------------------------------------------------------------------------------

ENDS: tuple[AttemptEnd, ...] = get_args(AttemptEnd)


def test_attempt_ends() -> None:
    assert set(ENDS) == {"succeeded", "failed", "interrupted", "timed_out"}


@pytest.mark.parametrize("retryable", [True, False])
@pytest.mark.parametrize("attempt", [1, 2, 3, 99])
def test_succeeded(attempt: int, retryable: bool) -> None:
    assert decide(RetryPolicy(), attempt, "succeeded", retryable) == TaskDecision("succeeded")
    assert decide(RetryPolicy(), attempt, "succeeded", retryable).retry_in_ms is None


def test_failed_retryable_waits_for_backoff() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert decide(policy, 1, "failed", retryable=True) == TaskDecision("waiting_retry", 1_000)
    assert decide(policy, 2, "failed", retryable=True) == TaskDecision("waiting_retry", 2_000)


def test_retryable_is_the_default() -> None:
    assert decide(RetryPolicy(), 1, "failed").task_state == "waiting_retry"


def test_failed_non_retryable_fails_at_once() -> None:
    assert decide(RetryPolicy(max_attempts=5), 1, "failed", retryable=False) == TaskDecision(
        "failed"
    )


@pytest.mark.parametrize("end", ["interrupted", "timed_out"])
@pytest.mark.parametrize("retryable", [True, False])
def test_interrupted_and_timed_out_always_retry(end: AttemptEnd, retryable: bool) -> None:
    policy = RetryPolicy(max_attempts=3)
    assert decide(policy, 1, end, retryable) == TaskDecision("waiting_retry", 1_000)
    assert decide(policy, 2, end, retryable) == TaskDecision("waiting_retry", 2_000)


@pytest.mark.parametrize("end", ["failed", "interrupted", "timed_out"])
@pytest.mark.parametrize("retryable", [True, False])
def test_last_attempt_fails(end: AttemptEnd, retryable: bool) -> None:
    policy = RetryPolicy(max_attempts=3)
    assert decide(policy, 3, end, retryable) == TaskDecision("failed")
    assert decide(policy, 4, end, retryable) == TaskDecision("failed")


@pytest.mark.parametrize("end", ["failed", "interrupted", "timed_out"])
def test_single_attempt_never_retries(end: AttemptEnd) -> None:
    assert decide(RetryPolicy(max_attempts=1), 1, end) == TaskDecision("failed")


@PROPERTY
@given(
    policies(),
    st.integers(min_value=1, max_value=MAX_ATTEMPTS + 5),
    st.sampled_from(ENDS),
    st.booleans(),
)
def test_decide_property(
    policy: RetryPolicy, attempt: int, end: AttemptEnd, retryable: bool
) -> None:
    decision = decide(policy, attempt, end, retryable)
    if end == "succeeded":
        assert decision == TaskDecision("succeeded")
    elif attempt >= policy.max_attempts or (end == "failed" and not retryable):
        assert decision == TaskDecision("failed")
    else:
        assert decision == TaskDecision("waiting_retry", policy.backoff_ms(attempt))
    # A retry delay exists exactly when the task waits.
    assert (decision.retry_in_ms is not None) == (decision.task_state == "waiting_retry")


@PROPERTY
@given(policies(), st.sampled_from(["failed", "interrupted", "timed_out"]))
def test_retryable_failures_use_exactly_max_attempts(policy: RetryPolicy, end: AttemptEnd) -> None:
    attempt = 1
    while decide(policy, attempt, end).task_state == "waiting_retry":
        attempt += 1
    assert attempt == policy.max_attempts


# --- hand-backs -------------------------------------------------------------------------


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=MAX_ATTEMPTS))
def test_a_free_hand_back_makes_the_task_ready_at_once(policy: RetryPolicy, charged: int) -> None:
    for free in range(MAX_FREE_HAND_BACKS):
        assert decide_hand_back(policy, charged, free) == TaskDecision("ready")


@PROPERTY
@given(policies(), st.integers(min_value=1, max_value=MAX_ATTEMPTS))
def test_past_the_bound_a_hand_back_is_an_interruption(policy: RetryPolicy, charged: int) -> None:
    for free in (MAX_FREE_HAND_BACKS, MAX_FREE_HAND_BACKS + 1):
        assert decide_hand_back(policy, charged, free) == decide(policy, charged, "interrupted")
