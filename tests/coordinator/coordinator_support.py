"""The coordinator under test, built over the test's pool, and passes run until one
reports what a test waits for. Workers, readers and the invariant checker come from
the kit (kit.db, kit.invariants)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.coordinator import Coordinator, PassReport
from awp_db.connect import Pool
from kit import poll_until


async def pass_until(
    coord: Coordinator, done: Callable[[PassReport], bool], *, within: float = 20.0
) -> PassReport:
    """Runs passes until one reports what done() looks for; fails after `within` s."""

    async def probe() -> PassReport | None:
        report = await coord.run_pass()
        return report if done(report) else None

    found = await poll_until(probe, within=within)
    assert found is not None
    return found


def coordinator(pool: Pool, dsn: str = "", **overrides: Any) -> Coordinator:
    settings: dict[str, Any] = {
        "database_url": dsn,
        "metrics_listen": None,
        "instance": "test",
        # These tests count dispatches against free slots exactly; prefetch (the
        # production default) has tests of its own.
        "dispatch_prefetch": 0.0,
    }
    settings.update(overrides)
    return Coordinator(pool, CoordinatorConfig(**settings))
