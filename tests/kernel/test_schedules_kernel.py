"""The calendar of schedules (awp_kernel.schedules): cron in a zone across DST, intervals,
catch-up plans and the refusals that name their field."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from awp_kernel.errors import AwpError
from awp_kernel.schedules import MAX_TICKS_PER_PASS, Cadence, cadence, check_policies, plan


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_daily_cron_in_new_york_across_spring_forward() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist that day.
    daily = cadence("30 2 * * *", 0, "America/New_York")
    ticks = daily.between(utc(2026, 3, 7), utc(2026, 3, 10), 10)
    assert ticks == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),  # the first instant after the jump: 03:00 EDT
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]


def test_daily_cron_in_new_york_across_fall_back_fires_once() -> None:
    # 2026-11-01: 02:00 EDT goes back to 01:00 EST, so 01:30 happens twice.
    daily = cadence("30 1 * * *", 0, "America/New_York")
    ticks = daily.between(utc(2026, 10, 31), utc(2026, 11, 3), 10)
    assert ticks == [utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]


def test_every_thirty_minutes_stays_thirty_minutes_of_real_time_across_fall_back() -> None:
    half_hourly = cadence("*/30 * * * *", 0, "America/New_York")
    ticks = half_hourly.between(utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 7, 0), 20)
    assert [b - a for a, b in itertools.pairwise(ticks)] == [timedelta(minutes=30)] * (
        len(ticks) - 1
    )
    assert len(ticks) == 6  # 00:30 EDT, 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST, 02:00 EST


def test_interval_ticks_are_whole_multiples_since_the_epoch() -> None:
    every = cadence("", 15 * 60 * 1000, "")
    assert every.after(utc(2026, 1, 1, 10, 7, 3)) == utc(2026, 1, 1, 10, 15)
    assert every.after(utc(2026, 1, 1, 10, 15)) == utc(2026, 1, 1, 10, 30)
    assert every.timezone == "UTC"


@pytest.mark.parametrize(
    ("cron", "interval_ms", "zone", "field"),
    [
        ("61 * * * *", 0, "UTC", "cron"),
        ("* * * * * *", 0, "UTC", "cron"),
        ("0 0 31 2 *", 0, "UTC", "cron"),
        ("not cron", 0, "UTC", "cron"),
        ("* * * * *", 0, "Mars/Olympus", "timezone"),
        ("* * * * *", 1000, "UTC", "cron"),
        ("", 0, "UTC", "cron"),
        ("", 10, "UTC", "interval"),
    ],
)
def test_bad_cadences_are_refused_naming_the_field(
    cron: str, interval_ms: int, zone: str, field: str
) -> None:
    with pytest.raises(AwpError) as caught:
        cadence(cron, interval_ms, zone)
    assert caught.value.violations[0].field == field


def test_bad_policies_are_refused_naming_the_field() -> None:
    for args, field in (
        (("sometimes", "all", 1000), "overlap"),
        (("skip", "maybe", 1000), "catchup"),
        (("skip", "all", 0), "catchup_window"),
    ):
        with pytest.raises(AwpError) as caught:
            check_policies(*args)
        assert caught.value.violations[0].field == field


SECOND = Cadence(None, 1000, "UTC")


def test_catch_up_all_fires_every_tick_within_the_window_oldest_first() -> None:
    now = utc(2026, 1, 1, 0, 0, 10, 500_000)
    got = plan(SECOND, utc(2026, 1, 1, 0, 0, 5), now, "all", 3000)
    assert got.fire == [utc(2026, 1, 1, 0, 0, s) for s in (8, 9, 10)]
    assert got.next_tick == utc(2026, 1, 1, 0, 0, 11)
    whole = plan(SECOND, utc(2026, 1, 1, 0, 0, 5), now, "all", 60_000)
    assert whole.fire == [utc(2026, 1, 1, 0, 0, s) for s in range(5, 11)]


def test_catch_up_all_is_bounded_per_pass_and_resumes_where_it_stopped() -> None:
    start = utc(2026, 1, 1)
    now = start + timedelta(seconds=250)
    first = plan(SECOND, start, now, "all", 3_600_000)
    assert len(first.fire) == MAX_TICKS_PER_PASS
    assert first.next_tick == first.fire[-1] + timedelta(seconds=1)


def test_catch_up_last_and_none() -> None:
    now = utc(2026, 1, 1, 0, 1, 0, 200_000)
    assert plan(SECOND, utc(2026, 1, 1), now, "last", 1000).fire == [utc(2026, 1, 1, 0, 1)]
    assert plan(SECOND, utc(2026, 1, 1), now, "none", 1000).fire == [utc(2026, 1, 1, 0, 1)]
    hourly = cadence("0 * * * *", 0, "UTC")
    late = utc(2026, 1, 1, 5, 30)
    assert plan(hourly, utc(2026, 1, 1, 1), late, "last", 60_000).fire == [utc(2026, 1, 1, 5)]
    assert plan(hourly, utc(2026, 1, 1, 1), late, "none", 60_000).fire == []
    assert plan(hourly, utc(2026, 1, 1, 1), late, "none", 60_000).next_tick == utc(2026, 1, 1, 6)


def test_nothing_due_fires_nothing() -> None:
    got = plan(SECOND, utc(2026, 1, 1, 0, 0, 2), utc(2026, 1, 1, 0, 0, 1, 5), "all", 1000)
    assert got.fire == []
    assert got.next_tick == utc(2026, 1, 1, 0, 0, 2)
