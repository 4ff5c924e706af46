"""When a schedule's ticks fall, and which of the due ones fire (docs/schedules.md).

Pure rules over the calendar: cron expressions are read by croniter, time zones by
zoneinfo (IANA), never by hand. A tick is an instant (UTC); the storage keys ticks by
(schedule, instant), so whatever fires them, each fires once.

DST (the library's answers, pinned by tests/kernel/test_schedules_kernel.py): a wall
time that does not exist (spring forward) fires at the first instant after the jump; a
wall time that occurs twice (fall back) fires once when the expression names fixed hours
("30 1 * * *": a daily job stays daily) and twice when it runs every hour ("*/30 * * * *":
an interval in real time stays one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from awp_kernel.errors import invalid

Overlap = Literal["skip", "buffer_one", "allow_all", "cancel_previous"]
Catchup = Literal["none", "last", "all"]
OVERLAPS: Final[tuple[Overlap, ...]] = get_args(Overlap)
CATCHUPS: Final[tuple[Catchup, ...]] = get_args(Catchup)

# The shortest interval: one tick a second is what the database clock and a pass can keep.
MIN_INTERVAL_MS: Final = 1000
MAX_INTERVAL_MS: Final = 366 * 24 * 3600 * 1000
# Standard five-field cron (minute hour day-of-month month day-of-week); sub-minute
# cadences are intervals.
CRON_FIELDS: Final = 5
DEFAULT_TIMEZONE: Final = "UTC"
# Catch-up window when none is given: a failover (seconds) is always caught up, a long
# outage does not start a storm of runs.
DEFAULT_CATCHUP_WINDOW_MS: Final = 60_000
MAX_CATCHUP_WINDOW_MS: Final = 366 * 24 * 3600 * 1000
# Ticks one schedule fires in one coordinator transaction (the rest in the next pass).
MAX_TICKS_PER_PASS: Final = 100
# Ticks one BackfillSchedule may start.
MAX_BACKFILL_TICKS: Final = 1000

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Longer than any DST shift (at most two hours, Antarctica/Troll).
_DST_REACH: Final = timedelta(hours=3)


@dataclass(frozen=True, slots=True)
class Cadence:
    """Either a cron expression read in a time zone, or a fixed interval (ticks at whole
    multiples of it since the Unix epoch, so they are the same for every coordinator)."""

    cron: str | None
    interval_ms: int | None
    timezone: str

    def after(self, instant: datetime) -> datetime:
        """The first tick strictly after instant (UTC)."""
        if self.interval_ms is not None:
            step = timedelta(milliseconds=self.interval_ms)
            return _EPOCH + ((instant - _EPOCH) // step + 1) * step
        assert self.cron is not None
        zone = ZoneInfo(self.timezone)
        # croniter keeps a repeated hour apart only while it iterates through it, not when
        # it starts inside it: near a transition, start before it and walk up to instant.
        near = _DST_REACH
        start = instant
        if (instant - near).astimezone(zone).utcoffset() != (instant + near).astimezone(
            zone
        ).utcoffset():
            start = instant - near
        cron = croniter(self.cron, start.astimezone(zone))
        fixed_hours = _fixed_hours(cron)
        while True:
            tick: datetime = cron.get_next(datetime)
            if tick > instant and not (fixed_hours and _repeated_wall_time(tick)):
                return tick.astimezone(UTC)

    def between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """Ticks t with start <= t <= end, oldest first, at most limit of them."""
        found: list[datetime] = []
        tick = self.after(start - timedelta(microseconds=1))
        while tick <= end and len(found) < limit:
            found.append(tick)
            tick = self.after(tick)
        return found


def _fixed_hours(cron: croniter) -> bool:
    """Whether the expression names some hours rather than every hour ('*')."""
    hours = cron.expanded[1]
    return hours != ["*"] and len(hours) < 24


def _repeated_wall_time(tick: datetime) -> bool:
    """Whether tick is the second occurrence of its wall time (the hour DST repeats)."""
    first = tick.replace(tzinfo=None).replace(tzinfo=tick.tzinfo, fold=0)
    return first.utcoffset() != tick.utcoffset()


def cadence(cron: str, interval_ms: int, timezone: str) -> Cadence:
    """The checked cadence of a schedule; INVALID_ARGUMENT naming the field otherwise."""
    zone = timezone or DEFAULT_TIMEZONE
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise invalid(
            "timezone", f"{zone!r} is not an IANA time zone (e.g. Europe/Paris)"
        ) from None
    if bool(cron) == bool(interval_ms):
        raise invalid("cron", "give exactly one of cron and interval")
    if interval_ms:
        if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
            raise invalid(
                "interval", f"must be between {MIN_INTERVAL_MS} ms and {MAX_INTERVAL_MS} ms"
            )
        return Cadence(None, interval_ms, zone)
    if len(cron.split()) != CRON_FIELDS or not croniter.is_valid(cron):
        raise invalid(
            "cron",
            f"{cron!r} is not a five-field cron expression (minute hour day month weekday)",
        )
    found = Cadence(cron, None, zone)
    try:
        found.after(datetime.now(UTC))
    except (CroniterBadCronError, CroniterBadDateError):
        raise invalid("cron", f"{cron!r} never fires") from None
    return found


def check_policies(overlap: str, catchup: str, window_ms: int) -> tuple[Overlap, Catchup]:
    for value, allowed, field in ((overlap, OVERLAPS, "overlap"), (catchup, CATCHUPS, "catchup")):
        if value not in allowed:
            raise invalid(field, f"{value!r} is not one of {', '.join(allowed)}")
    if not 0 < window_ms <= MAX_CATCHUP_WINDOW_MS:
        raise invalid("catchup_window", f"must be positive and at most {MAX_CATCHUP_WINDOW_MS} ms")
    return overlap, catchup  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a pass does for one schedule: the ticks it fires (oldest first) and the
    schedule's next tick after them."""

    fire: list[datetime]
    next_tick: datetime


def plan(
    cadence: Cadence, next_tick: datetime, now: datetime, catchup: Catchup, window_ms: int
) -> Plan:
    """The due ticks (next_tick <= t <= now) a pass fires under the catch-up policy.

    all: every due tick no more than the window late, oldest first; older ones are
    dropped. last: only the newest due tick, however late. none: only the newest due
    tick, and only if it is no more than the window late. Dropped ticks are never fired
    (nothing records them): that is the policy's promise, not a gap in it.
    """
    window = timedelta(milliseconds=window_ms)
    if catchup == "all":
        start = max(next_tick, now - window)
        fire = cadence.between(start, now, MAX_TICKS_PER_PASS)
        if len(fire) == MAX_TICKS_PER_PASS:
            return Plan(fire, cadence.after(fire[-1]))
        return Plan(fire, cadence.after(now))
    newest = _newest_due(cadence, next_tick, now)
    if newest is None or (catchup == "none" and now - newest > window):
        return Plan([], cadence.after(now))
    return Plan([newest], cadence.after(now))


def _newest_due(cadence: Cadence, next_tick: datetime, now: datetime) -> datetime | None:
    if next_tick > now:
        return None
    if cadence.interval_ms is not None:
        step = timedelta(milliseconds=cadence.interval_ms)
        newest = _EPOCH + ((now - _EPOCH) // step) * step
        return newest if newest >= next_tick else None
    at_now = cadence.after(now - timedelta(microseconds=1))
    if at_now == now:
        return now
    assert cadence.cron is not None
    zone = ZoneInfo(cadence.timezone)
    cron = croniter(cadence.cron, now.astimezone(zone))
    fixed_hours = _fixed_hours(cron)
    while True:
        tick: datetime = cron.get_prev(datetime)
        if not (fixed_hours and _repeated_wall_time(tick)):
            break
    tick = tick.astimezone(UTC)
    return tick if tick >= next_tick else None


@dataclass(frozen=True, slots=True)
class Decision:
    """What a tick does under the overlap policy: start a run (canceling the running
    ones first for cancel_previous), or be recorded as skipped or buffered."""

    outcome: Literal["started", "skipped", "buffered"]
    cancel_running: bool = False


def decide_overlap(overlap: Overlap, running: bool, buffered: bool) -> Decision:
    """running: a run of the schedule is still running; buffered: a tick already waits."""
    if not running or overlap == "allow_all":
        return Decision("started")
    if overlap == "cancel_previous":
        return Decision("started", cancel_running=True)
    if overlap == "buffer_one" and not buffered:
        return Decision("buffered")
    return Decision("skipped")
