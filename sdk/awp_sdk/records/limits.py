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
