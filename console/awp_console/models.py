"""What the console shows, as plain values: the adapter (awp_console.api) makes them from
the API's messages, and the pages and the browser's JSON are made from them.

States are the protocol's lower-case names ("waiting_retry"); times are aware datetimes
(UTC); JSON values keep their integers (awp_protocol.jsonvalue).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

from awp_protocol.roles import ROLES_OF, Role
from awp_protocol.states import HANDED_BACK

CONTROL: Final = "/awp.v1.ControlService/"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the console acts for: a credential of the server (or anyone, without them)."""

    name: str
    roles: frozenset[Role]
    credentials_required: bool

    def may(self, rpc: str) -> bool:
        """Whether the server lets this caller make the ControlService call `rpc`."""
        return bool(self.roles & ROLES_OF[CONTROL + rpc])


@dataclass(frozen=True, slots=True)
class TaskError:
    message: str
    retryable: bool = False
    type: str = ""
    traceback: str = ""
    log_tail: str = ""


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    workflow_name: str
    workflow_version: int
    state: str
    created_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    last_seq: int
    # Lifecycle order, states with no task left out.
    tasks_by_state: Mapping[str, int]
    input: Mapping[str, Any]
    request_id: str = ""
    started_by: str = ""
    cancel_requested_by: str = ""
    retried_from_run_id: str = ""
    retry_from_task: str = ""

    @property
    def task_count(self) -> int:
        return sum(self.tasks_by_state.values())

    @property
    def canceling(self) -> bool:
        return self.state == "running" and self.cancel_requested_at is not None


@dataclass(frozen=True, slots=True)
class Task:
    key: str
    state: str
    executor_kind: str
    action: str
    depends_on: tuple[str, ...]
    attempts: int
    max_attempts: int
    output: Mapping[str, Any] | None = None
    error: TaskError | None = None
    retry_at: datetime | None = None
    finished_at: datetime | None = None
    reused_from_run_id: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    task_key: str
    attempt: int
    state: str
    worker_id: str
    started_at: datetime | None
    deadline: datetime | None
    finished_at: datetime | None
    error: TaskError | None = None
    # ListAttempts only.
    worker_name: str = ""

    @property
    def outcome(self) -> str:
        """How it ended, for people: the state, except that a hand-back by a draining
        worker is told from a lost lease (both end `interrupted`)."""
        if self.state == "interrupted" and self.error and self.error.message == HANDED_BACK:
            return "handed back"
        return self.state.replace("_", " ")


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: Run
    tasks: tuple[Task, ...]
    # GetRun's: errors without traceback or log tail.
    attempts: tuple[Attempt, ...]
    # Later tasks (map elements past GetRun's 10,000) not listed.
    tasks_omitted: int = 0


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    # Empty on the last page.
    next_token: str = ""


@dataclass(frozen=True, slots=True)
class Event:
    """One StateEvent: what changed (`type`), whose (`task_key`, `attempt`) and into what."""

    seq: int
    type: str  # run_created, run_state, task_state, attempt_state, run_cancel_requested
    task_key: str
    attempt: int
    to_state: str


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    key: str
    executor_kind: str
    action: str
    input: Mapping[str, Any]
    depends_on: tuple[str, ...]
    max_attempts: int
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Workflow:
    name: str
    version: int
    description: str
    concurrency: int
    tasks: tuple[TaskDefinition, ...]
    created_at: datetime | None
    # The definition as protobuf JSON would give it, integers kept: what the page shows.
    definition: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Worker:
    id: str
    name: str
    state: str
    executor_kinds: tuple[str, ...]
    max_concurrency: int
    active_leases: int
    labels: Mapping[str, str]
    protocol_version: int
    registered_at: datetime | None
    last_heartbeat_at: datetime | None


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    workflow: str  # NAME or NAME@VERSION
    cadence: str  # the cron expression and its zone, or the interval
    overlap: str
    catchup: str
    paused: bool
    next_fire_at: datetime | None


@dataclass(frozen=True, slots=True)
class KindCount:
    state: str
    executor_kind: str
    count: int


@dataclass(frozen=True, slots=True)
class Stats:
    tasks_by_state: tuple[KindCount, ...]
    dispatches_by_state: tuple[KindCount, ...]
    runs_by_state: Mapping[str, int]
    workers_by_state: Mapping[str, int]
    active_leases: int
    oldest_pending_s: float | None
