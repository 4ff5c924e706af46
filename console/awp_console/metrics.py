"""The reliability figures of the overview, read from the processes' Prometheus endpoints.

The console is given the /metrics URLs of awp-server(s) and awp-coordinator(s)
(--metrics-url); each figure is the sum of one counter over every endpoint that answers
(several servers each count their own calls). Counters start at zero with their process:
the figures are "since the processes started", and say so on the page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class Series:
    """One counter sample: the metric's sample name and the labels it must carry."""

    label: str
    sample: str
    labels: Mapping[str, str]
    meaning: str


# The names are the processes' public metrics (docs/console.md lists them; a test checks
# that awp-server and awp-coordinator still export each).
FIGURES: Final = (
    Series(
        "late results rejected",
        "awp_complete_results_total",
        {"verdict": "lease_lost"},
        "results from a holder whose lease had been lost: fenced out, not applied",
    ),
    Series(
        "duplicate completes",
        "awp_complete_results_total",
        {"verdict": "duplicate"},
        "the same result reported again: answered as before, applied once",
    ),
    Series(
        "conflicting results refused",
        "awp_complete_results_total",
        {"verdict": "result_conflict"},
        "a second, different result for an attempt that already had one",
    ),
    Series(
        "attempts interrupted: lease expired",
        "awp_coordinator_items_total",
        {"kind": "interrupted"},
        "leases that ran out without a renewal (the holder went silent)",
    ),
    Series(
        "attempts interrupted: worker offline",
        "awp_coordinator_items_total",
        {"kind": "offline_leases"},
        "leases of workers that stopped heartbeating, settled when they were marked offline",
    ),
    Series(
        "attempts timed out",
        "awp_coordinator_items_total",
        {"kind": "timed_out"},
        "attempts whose task timeout passed",
    ),
    Series(
        "workers marked offline",
        "awp_coordinator_items_total",
        {"kind": "offline_workers"},
        "worker sessions silent for longer than the offline rule allows",
    ),
    Series(
        "heartbeat streams lost",
        "awp_heartbeat_streams_lost_total",
        {},
        "streams that broke without a drain: their leases were shortened to the grace",
    ),
    Series(
        "leader takeovers",
        "awp_coordinator_takeovers_total",
        {},
        "times a coordinator took over an expired or released leader lease",
    ),
)


@dataclass(frozen=True, slots=True)
class Figure:
    series: Series
    # None: no endpoint that answered exports it.
    value: float | None


@dataclass(frozen=True, slots=True)
class Scrape:
    figures: tuple[Figure, ...]
    # (url, what went wrong) for each endpoint that did not answer usefully.
    failures: tuple[tuple[str, str], ...]
    reached: int


def counts_of(text: str) -> dict[int, float]:
    """The value of each figure (by its index in FIGURES) one exposition text carries;
    ValueError when the text is not the Prometheus text format."""
    totals: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        # A labelled counter nothing has counted yet exports no sample: zero, not absent.
        for n, series in enumerate(FIGURES):
            if series.sample in (family.name, f"{family.name}_total"):
                totals.setdefault(n, 0.0)
        for sample in family.samples:
            for n, series in enumerate(FIGURES):
                if sample.name == series.sample and all(
                    sample.labels.get(k) == v for k, v in series.labels.items()
                ):
                    totals[n] = totals.get(n, 0.0) + sample.value
    return totals


async def scrape(urls: Sequence[str]) -> Scrape:
    """Every endpoint at once; one that fails is named, the others still count."""
    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
        answers = await asyncio.gather(*(client.get(url) for url in urls), return_exceptions=True)
    totals: dict[int, float] = {}
    failures: list[tuple[str, str]] = []
    reached = 0
    for url, answer in zip(urls, answers, strict=True):
        if isinstance(answer, BaseException):
            failures.append((url, str(answer) or type(answer).__name__))
            continue
        if answer.status_code != httpx.codes.OK:
            failures.append((url, f"HTTP {answer.status_code}"))
            continue
        try:
            counts = counts_of(answer.text)
        except ValueError as exc:
            failures.append((url, f"not Prometheus metrics: {exc}"))
            continue
        reached += 1
        for n, value in counts.items():
            totals[n] = totals.get(n, 0.0) + value
    figures = tuple(Figure(series, totals.get(n)) for n, series in enumerate(FIGURES))
    return Scrape(figures, tuple(failures), reached)
