"""The retry rule: when a failed, interrupted or timed-out attempt is tried again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    """What happens to a task once one of its attempts ended."""

    task_state: Literal["succeeded", "failed", "waiting_retry"]
    retry_in_ms: int | None = None


def decide(
    policy: RetryPolicy, attempt: int, end: AttemptEnd, retryable: bool = True
) -> TaskDecision:
    """Interrupted and timed-out attempts are always retryable; a failure only if it says so."""
    if end == "succeeded":
        return TaskDecision("succeeded")
    may_retry = retryable or end in ("interrupted", "timed_out")
    if may_retry and attempt < policy.max_attempts:
        return TaskDecision("waiting_retry", policy.backoff_ms(attempt))
    return TaskDecision("failed")
