"""How fast work lost with a dead worker ran again: from the worker's last heartbeat (as
near to its death as the platform can know) to the start of the task's next attempt.

Read from the public API alone: a run's attempts (GetRun) and the worker sessions
(ListWorkers with the inactive ones). An attempt counts when it ended `interrupted` and
its worker's session is now `offline` (it went silent, not a drain's hand-back).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from awp_sdk.records import Attempt, Worker


@dataclass(frozen=True, slots=True)
class Recovery:
    task_key: str
    lost_attempt: int
    worker_name: str
    # The dead worker's last heartbeat.
    lost_at: datetime
    # The next attempt's start; None while the task has not run again.
    restarted_at: datetime | None

    @property
    def seconds(self) -> float | None:
        if self.restarted_at is None:
            return None
        return max((self.restarted_at - self.lost_at).total_seconds(), 0.0)


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    median_s: float | None
    max_s: float | None


def recoveries(attempts: Iterable[Attempt], workers: Mapping[str, Worker]) -> list[Recovery]:
    started: dict[tuple[str, int], datetime | None] = {}
    lost: list[tuple[Attempt, Worker]] = []
    for attempt in attempts:
        started[(attempt.task_key, attempt.attempt)] = attempt.started_at
        worker = workers.get(attempt.worker_id)
        if (
            attempt.state == "interrupted"
            and worker is not None
            and worker.state == "offline"
            and worker.last_heartbeat_at is not None
        ):
            lost.append((attempt, worker))
    found = []
    for attempt, worker in lost:
        assert worker.last_heartbeat_at is not None
        found.append(
            Recovery(
                attempt.task_key,
                attempt.attempt,
                worker.name,
                worker.last_heartbeat_at,
                started.get((attempt.task_key, attempt.attempt + 1)),
            )
        )
    return found


def summary(found: Iterable[Recovery]) -> Summary:
    seconds = [s for r in found if (s := r.seconds) is not None]
    if not seconds:
        return Summary(0, None, None)
    return Summary(len(seconds), statistics.median(seconds), max(seconds))
