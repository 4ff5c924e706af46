"""Rate limits and token budgets: what a task uses of a named limit per grant.

A task declares, per named limit, how many units one execution uses: a whole number
("1") or one placeholder naming an integer of the run's input ("{input.max_tokens}",
the grammar of awp_kernel.concurrency). The units are rendered when the task is
created; each grant charges them as an estimate, and the usage the attempt reports when
it completes replaces the estimate (docs/workflows.md, "Rate limits and token budgets").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from awp_kernel import concurrency
from awp_protocol.errors import quote
from awp_protocol.limits import MAX_RATE_UNITS, MAX_RATE_USES
from awp_protocol.names import NAME_PATTERN, NAME_RULE

_WHOLE: Final = re.compile(r"[0-9]{1,19}")
UNITS_RULE: Final = (
    "a whole number, or one placeholder {input.<field>[.<field>...]} naming an integer "
    "of the run's input"
)


class UnitsUnrenderable(ValueError):
    """The run's input has no usable integer where the units' placeholder points."""


@dataclass(frozen=True, slots=True)
class RateUse:
    """One execution of the task uses `units` of the named limit `limit`."""

    limit: str
    units: str

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "units": self.units}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RateUse:
        return cls(limit=data["limit"], units=data["units"])


def violations(uses: Sequence[RateUse]) -> list[tuple[str, str]]:
    """(field suffix, description) for each bad use of one task."""
    found: list[tuple[str, str]] = []
    if len(uses) > MAX_RATE_USES:
        found.append(("rate_limits", f"at most {MAX_RATE_USES} rate limits per task"))
    seen: set[str] = set()
    for index, use in enumerate(uses):
        where = f"rate_limits[{index}]"
        if not NAME_PATTERN.fullmatch(use.limit):
            found.append((f"{where}.limit", f"must be {NAME_RULE}"))
        elif use.limit in seen:
            found.append((f"{where}.limit", f"{quote(use.limit)} is listed twice"))
        seen.add(use.limit)
        if not _is_units(use.units):
            found.append((f"{where}.units", f"{quote(use.units)} is not {UNITS_RULE}"))
    return found


def _is_units(units: str) -> bool:
    if _WHOLE.fullmatch(units):
        return int(units) <= MAX_RATE_UNITS
    try:
        parts = concurrency.parse(units)
    except concurrency.KeyTemplateInvalid:
        return False
    return len(parts) == 1 and isinstance(parts[0], tuple)


def render(units: str, run_input: Mapping[str, Any]) -> int:
    """The units one execution is charged; UnitsUnrenderable naming the placeholder."""
    if _WHOLE.fullmatch(units):
        return int(units)
    try:
        text = concurrency.render(units, run_input)
    except concurrency.KeyUnrenderable as exc:
        raise UnitsUnrenderable(str(exc)) from None
    if not _WHOLE.fullmatch(text) or int(text) > MAX_RATE_UNITS:
        raise UnitsUnrenderable(
            f"{units} is {quote(text)}; units must be a whole number up to {MAX_RATE_UNITS}"
        )
    return int(text)
