"""Workers, counts and the caller: ListWorkers, GetStats, PruneRuns and WhoAmI's answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from awp_protocol.roles import ROLES_OF
from awp_sdk.enums import DispatchState, RunState, TaskState, WorkerState

_CONTROL = "/awp.v1.ControlService/"


@dataclass(frozen=True)
class Worker:
    """One worker session (ListWorkers)."""

    id: str
    name: str
    state: WorkerState
    executor_kinds: tuple[str, ...]
    max_concurrency: int
    active_leases: int
    labels: Mapping[str, str]
    protocol_version: int
    registered_at: datetime | None
    last_heartbeat_at: datetime | None
    stopped_at: datetime | None
    # Placement (docs/workflows.md "Placement"): its models (each the label
    # "model=<name>"), each resource's capacity and the units its live leases reserve.
    models: tuple[str, ...] = ()
    resources: Mapping[str, int] = field(default_factory=dict)
    reserved: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskCount:
    """Tasks of running runs in one state, of one executor kind."""

    state: TaskState
    executor_kind: str
    count: int


@dataclass(frozen=True)
class DispatchCount:
    """Pending or leased dispatches in one state, of one executor kind."""

    state: DispatchState
    executor_kind: str
    count: int


@dataclass(frozen=True)
class Stats:
    """GetStats: what the system holds now, states in lifecycle order, zeros left out."""

    tasks_by_state: tuple[TaskCount, ...]
    dispatches_by_state: tuple[DispatchCount, ...]
    runs_by_state: Mapping[RunState, int]
    workers_by_state: Mapping[WorkerState, int]
    active_leases: int
    # Age of the oldest pending dispatch; None when none is pending.
    oldest_pending: timedelta | None


@dataclass(frozen=True)
class Pruned:
    """What one PruneRuns call deleted (dry run: would delete), by table; ``remaining``
    runs past the age are still stored: call again while it is above 0."""

    runs: int
    tasks: int
    attempts: int
    dispatches: int
    events: int
    remaining: int
    # Runs that finished before this instant qualified.
    cutoff: datetime | None
    # Dry run: pass it back to count the next page; empty once every run was counted.
    next_page_token: str


@dataclass(frozen=True)
class Identity:
    """WhoAmI: the caller's credential name and roles (docs/security.md);
    credentials_required False on a server without credentials (anyone may do anything).
    Roles are kept as the server names them: one this SDK does not know grants nothing
    here, yet is shown."""

    name: str
    roles: frozenset[str]
    credentials_required: bool

    def may(self, rpc: str) -> bool:
        """Whether the server lets this caller make the ControlService call `rpc`
        ("StartRun")."""
        return any(role in self.roles for role in ROLES_OF[_CONTROL + rpc])
