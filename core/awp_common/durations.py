"""Durations as people write them: "250ms", "1.5s", "2m", "1h30m", "30d", or a number of
seconds.

One parser for every duration flag and every duration in a workflow file, so that both
accept the same text and reject it with the same words.
"""

from __future__ import annotations

import math
import re
from typing import Final

_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_DURATION: Final = re.compile(rf"(?:{_PART.pattern})+")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_HELP: Final = 'a duration such as "250ms", "1.5s", "2m", "1h", "7d" or a number of seconds'


def parse_duration(value: object, *, numeric_text: bool = False) -> float:
    """Seconds in a duration value (text, or a number of seconds); ValueError naming the
    value when it is not one.

    numeric_text: "30" (text) means thirty seconds, as flags and environment variables
    (always text) need. A workflow file has numbers of its own, so a quoted "30" there is
    more likely a missing unit than a number.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HELP}, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        seconds = sum(
            float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(value.strip())
        )
    elif numeric_text and isinstance(value, str) and _is_number(value):
        seconds = float(value)
    else:
        raise ValueError(f"expected {DURATION_HELP}, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"must be a finite, non-negative duration, got {value!r}")
    return seconds


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_duration(seconds: float) -> str:
    """The way durations are written back: 250ms, 1.5s, 2m, 1h30m, 30d."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    text = (f"{days}d" if days else "") + (f"{hours}h" if hours else "")
    text += f"{minutes}m" if minutes else ""
    return text + (f"{rest}s" if rest else "")
