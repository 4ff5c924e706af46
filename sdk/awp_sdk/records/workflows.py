"""Stored workflow versions: CreateWorkflow, GetWorkflow and ListWorkflows' answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from awp_sdk.enums import CheckpointKind, FailurePolicy


@dataclass(frozen=True)
class StoredRetry:
    """A task's retry rule as stored; None: the server's default."""

    max_attempts: int | None
    initial_backoff: timedelta | None
    max_backoff: timedelta | None
    multiplier: float | None


@dataclass(frozen=True)
class StoredConcurrency:
    """A keyed limit: at most ``max`` live leases hold the key ``key`` renders to."""

    key: str
    max: int


@dataclass(frozen=True)
class StoredRateUse:
    """One execution charges ``units`` (a number, or "{input.<field>}") of limit ``limit``."""

    limit: str
    units: str


@dataclass(frozen=True)
class StoredMap:
    """Fan-out: once per element of the list at ``path`` in task ``over``'s output."""

    over: str
    path: str


@dataclass(frozen=True)
class StoredWait:
    """A wait task no worker runs: a SLEEP of ``sleep`` from when it is ready, or an
    APPROVAL asking ``prompt`` (``timeout`` None: waits for ever; ``role``: who besides
    admins may decide, "" for approvers)."""

    kind: CheckpointKind
    sleep: timedelta | None
    prompt: str
    timeout: timedelta | None
    role: str


@dataclass(frozen=True)
class StoredTask:
    """One task of a stored workflow definition."""

    key: str
    executor_kind: str
    action: str
    input: dict[str, Any]
    depends_on: tuple[str, ...]
    # None: the defaults (3 attempts; 5 minutes per attempt; run once).
    retry: StoredRetry | None
    timeout: timedelta | None
    map: StoredMap | None
    on_failure: FailurePolicy
    always: bool
    concurrency_limits: tuple[StoredConcurrency, ...]
    rate_limits: tuple[StoredRateUse, ...]
    # Set on a wait task (no executor_kind nor action).
    wait: StoredWait | None = None
    # Added to its run's priority (docs/workflows.md "Priorities").
    priority: int = 0
    # Placement (docs/workflows.md "Placement"): "key=value" labels its worker must have
    # and prefers, units of resources it reserves, and whether it sticks to its run's
    # last worker.
    required_labels: tuple[str, ...] = ()
    preferred_labels: tuple[str, ...] = ()
    resources: Mapping[str, int] = field(default_factory=dict)
    sticky: bool = False


@dataclass(frozen=True)
class StoredWorkflow:
    """One immutable workflow version as the server stores it."""

    name: str
    version: int
    description: str
    # Tasks of one run queued or running at once; 0: unlimited.
    concurrency: int
    tasks: tuple[StoredTask, ...]
    created_at: datetime | None
    # The definition as protobuf JSON (proto field names), integers kept: what a page or
    # `awp workflow show --json` prints.
    definition: dict[str, Any]


@dataclass(frozen=True)
class Applied:
    """What CreateWorkflow answered: created False when the identical definition existed."""

    name: str
    version: int
    created: bool
    workflow: StoredWorkflow | None = None
