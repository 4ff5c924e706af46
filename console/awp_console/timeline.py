"""The run page's timeline: each task's attempts on one row, in time (which worker ran
each, when, for how long, how it ended), drawn as SVG on the server like the graph.

An interrupted attempt next to a later one on another worker is what a rescue looks
like; the attempts' fencing tokens are in each bar's tooltip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from awp_sdk.records import Attempt

# Geometry, in SVG user units.
LABEL_W: Final = 140
PLOT_W: Final = 720
ROW_H: Final = 26
BAR_H: Final = 16
AXIS_H: Final = 22
# A bar never thinner than this, so an attempt of a few milliseconds still shows.
MIN_BAR_W: Final = 3.0
# About how wide a label's character is at the labels' font size: a label that does not
# fit in its bar goes after it.
CHAR_W: Final = 6.0
# More rows than this are left out (the attempts list has them all).
MAX_ROWS: Final = 60


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    state: str
    label: str
    title: str
    # Whether the label fits inside the bar (else it is drawn after it).
    label_inside: bool


@dataclass(frozen=True, slots=True)
class Row:
    y: float
    task_key: str


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True, slots=True)
class Timeline:
    width: float
    height: float
    rows: tuple[Row, ...]
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    # Tasks with attempts beyond MAX_ROWS.
    rows_left_out: int


def draw(
    attempts: Sequence[Attempt],
    worker_names: Mapping[str, str],
    start: datetime,
    end: datetime,
) -> Timeline | None:
    """The timeline of the run's attempts between start and end; None without attempts."""
    started = [a for a in attempts if a.started_at is not None]
    if not started:
        return None
    keys = list(dict.fromkeys(a.task_key for a in sorted(started, key=_start)))
    shown = keys[:MAX_ROWS]
    span_s = max((end - start).total_seconds(), 1e-3)
    scale = PLOT_W / span_s

    def x_of(instant: datetime) -> float:
        return LABEL_W + max(0.0, (instant - start).total_seconds()) * scale

    row_of = {key: i for i, key in enumerate(shown)}
    bars = []
    for a in started:
        row = row_of.get(a.task_key)
        if row is None:
            continue
        x = x_of(_start(a))
        width = max(MIN_BAR_W, x_of(a.finished_at or end) - x)
        worker = worker_names.get(a.worker_id) or a.worker_id[:8]
        took = ((a.finished_at or end) - _start(a)).total_seconds()
        label = f"#{a.attempt} {worker}"
        bars.append(
            Bar(
                x=x,
                y=AXIS_H + row * ROW_H + (ROW_H - BAR_H) / 2,
                width=width,
                state=a.state.value,
                label=label,
                title=(
                    f"{a.task_key} attempt {a.attempt} on {worker}: {a.state.value} after "
                    f"{took:.2f}s (fencing token {a.fencing_token})"
                ),
                label_inside=width >= len(label) * CHAR_W + 8,
            )
        )
    rows = tuple(Row(AXIS_H + i * ROW_H, key) for i, key in enumerate(shown))
    ticks = tuple(Tick(LABEL_W + PLOT_W * i / 4, f"+{span_s * i / 4:.1f}s") for i in range(5))
    height = AXIS_H + len(shown) * ROW_H + 4
    # Room on the right for the label of a short last bar.
    width = LABEL_W + PLOT_W + 200
    return Timeline(width, height, rows, tuple(bars), ticks, len(keys) - len(shown))


def _start(attempt: Attempt) -> datetime:
    assert attempt.started_at is not None
    return attempt.started_at
