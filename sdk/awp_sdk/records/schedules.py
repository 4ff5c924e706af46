"""Schedules (docs/schedules.md): a schedule as GetSchedule and ListSchedules describe it,
and the ticks it fired."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from awp_sdk.enums import CatchupPolicy, OverlapPolicy


@dataclass(frozen=True)
class ScheduleTick:
    """One fired tick: when, by what ("schedule", "trigger", "backfill"), with what
    outcome ("started", "skipped", "buffered"), the run it started and the leader epoch
    that fired it (0 for a trigger or a backfill)."""

    at: datetime | None
    source: str
    outcome: str
    run_id: str | None
    leader_epoch: int
    created_at: datetime | None


@dataclass(frozen=True)
class Schedule:
    id: str
    name: str
    workflow: str
    version: int  # 0: the latest at each tick
    input: dict[str, Any]
    cron: str | None
    every: timedelta | None
    timezone: str
    overlap: OverlapPolicy
    catchup: CatchupPolicy
    catchup_window: timedelta | None
    paused: bool
    next_fire_at: datetime | None  # None while paused
    created_at: datetime | None
    created_by: str
    updated_at: datetime | None
    updated_by: str
    # GetSchedule only: the newest ticks, newest first.
    recent_ticks: tuple[ScheduleTick, ...] = ()

    @property
    def cadence(self) -> str:
        """How it fires, as the CLI and the console show it: "0 2 * * * (Europe/Paris)",
        or "every 0:15:00"."""
        if self.cron:
            return f"{self.cron} ({self.timezone})"
        return f"every {self.every}"
