"""Rate limits and token budgets (docs/workflows.md): a limit as GetRateLimit and
ListRateLimits describe it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RateLimit:
    """At most ``units`` granted in any window of ``period``; ``used``: charged in the
    window ending now (reported usage where known, else estimates); ``paused_until``: set
    while a slow-down report pauses it."""

    name: str
    units: int
    period: timedelta | None
    used: int
    paused_until: datetime | None
    updated_at: datetime | None
    updated_by: str


@dataclass(frozen=True)
class LimitWaiting:
    """One limit (a rate limit's name or a rendered concurrency key) and the ready tasks it
    holds back now, by the grant's own tests; a task held back by two limits counts at
    each."""

    name: str
    waiting: int


@dataclass(frozen=True)
class LimitsOverview:
    """ListRateLimits: every rate limit by name, and the limits holding back ready tasks
    now (those holding back none are left out), read in one snapshot. How long a limit has
    held tasks back is the coordinator's metric awp_limit_throttled_seconds_total, not
    stored (docs/design.md §17, "Watching limits")."""

    limits: tuple[RateLimit, ...]
    rate_limits_waiting: tuple[LimitWaiting, ...]
    keys_waiting: tuple[LimitWaiting, ...]

    def waiting_for(self, limit: str) -> int:
        """The ready tasks the rate limit named holds back now (0: none, or no such
        limit)."""
        return next((w.waiting for w in self.rate_limits_waiting if w.name == limit), 0)
