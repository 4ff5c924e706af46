"""The retry rule: when a failed, interrupted or timed-out attempt is tried again, and
what a lease handed back by a draining worker costs its task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from awp_protocol.limits import MAX_FREE_HAND_BACKS

AttemptEnd = Literal["succeeded", "failed", "interrupted", "timed_out"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    multiplier: float = 2.0

    def backoff_ms(self, attempt: int) -> int:
        """Delay before the attempt after `attempt` (1-based): exponential, capped."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        # min(initial * multiplier^(attempt-1), max), computed in floats: an int multiplier
        # would build a huge integer, and no fixed exponent cap is right for every multiplier.
        multiplier = float(self.multiplier)
        if self.initial_backoff_ms <= 0 or multiplier == 1.0:
            return max(0, min(self.initial_backoff_ms, self.max_backoff_ms))
        try:
            delay = self.initial_backoff_ms * (multiplier ** (attempt - 1))
        except OverflowError:
            # A huge attempt number: the exponential is past any cap.
            return self.max_backoff_ms if multiplier > 1.0 else 0
        return int(min(delay, self.max_backoff_ms))


@dataclass(frozen=True, slots=True)
class TaskDecision:
    """What happens to a task once one of its attempts ended. `ready` (at once, nothing
    charged) only follows a free hand-back."""

    task_state: Literal["succeeded", "failed", "waiting_retry", "ready"]
    retry_in_ms: int | None = None


def decide(
    policy: RetryPolicy, charged: int, end: AttemptEnd, retryable: bool = True
) -> TaskDecision:
    """Interrupted and timed-out attempts are always retryable; a failure only if it says so.

    `charged` counts the task's attempts that spent its budget, this one included: its
    attempt number less its free hand-backs (`decide_hand_back`).
    """
    if end == "succeeded":
        return TaskDecision("succeeded")
    may_retry = retryable or end in ("interrupted", "timed_out")
    if may_retry and charged < policy.max_attempts:
        return TaskDecision("waiting_retry", policy.backoff_ms(charged))
    return TaskDecision("failed")


def hand_back_is_free(free_hand_backs: int) -> bool:
    """Whether a task that has had `free_hand_backs` may have one more free of charge."""
    return free_hand_backs < MAX_FREE_HAND_BACKS


def decide_hand_back(policy: RetryPolicy, charged: int, free_hand_backs: int) -> TaskDecision:
    """A lease handed back by a draining worker is not the task's fault: the task is ready
    again at once, no attempt spent, no backoff waited. Past MAX_FREE_HAND_BACKS it is an
    ordinary interruption (`charged` includes this attempt, as for `decide`)."""
    if hand_back_is_free(free_hand_backs):
        return TaskDecision("ready")
    return decide(policy, charged, "interrupted")
