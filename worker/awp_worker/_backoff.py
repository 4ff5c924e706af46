"""Capped exponential backoff with jitter, reset after success."""

from __future__ import annotations

import random


class Backoff:
    """Delays ``initial * multiplier**n`` capped at ``maximum``, each shortened by jitter.

    With ``jitter`` = j every delay is drawn uniformly from ``[d * (1 - j), d]``, so
    peers that failed together do not retry together, and no delay exceeds the cap.
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        if multiplier < 1:
            raise ValueError(f"backoff multiplier must be >= 1, got {multiplier}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"backoff jitter must be within [0, 1], got {jitter}")
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last reset."""
        return self._failures

    def peek(self) -> float:
        """The un-jittered delay the next call to ``next()`` is based on."""
        # Cap the exponent first so a long outage cannot overflow the float.
        exponent = min(self._failures, 64)
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def next(self) -> float:
        """The delay to wait after one more failure."""
        base = self.peek()
        self._failures += 1
        return base * (1.0 - self.jitter * self._rng.random())

    def reset(self) -> None:
        self._failures = 0
