"""Runs, their tasks, attempts and events: GetRun, ListRuns, ListTasks, ListAttempts,
StartRun, CancelRun, RetryRun and WatchRun's answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from awp_protocol.states import HANDED_BACK, charged_attempts
from awp_sdk.enums import AttemptState, EventType, RunState, TaskState
from awp_sdk.errors import OutputsOmitted
from awp_sdk.records.durable import MemoSavings, TaskWait

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a List call; next_page_token is empty on the last page."""

    items: tuple[T, ...]
    next_page_token: str = ""


@dataclass(frozen=True)
class Run:
    """One run, as ListRuns, GetRun, StartRun, CancelRun and RetryRun describe it."""

    id: str
    workflow: str
    version: int
    state: RunState
    input: dict[str, Any]
    request_id: str
    revision: int
    last_seq: int
    created_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    # The audit trail: who started it, who asked for its cancellation (None: nobody).
    started_by: str
    cancel_requested_by: str | None = None
    # How many tasks (map elements included) are in each state, in lifecycle order.
    task_counts: Mapping[TaskState, int] = field(default_factory=dict)
    # Set when a retry started this run: the run it retried, and its from_task.
    retried_from_run_id: str | None = None
    retry_from_task: str | None = None
    # Set when a schedule's tick started this run: the schedule's id and the tick.
    schedule_id: str | None = None
    schedule_tick: datetime | None = None
    # A delayed start: when its first tasks become (or became) ready.
    start_time: datetime | None = None
    # The trace it belongs to, for a tracing UI (docs/observability.md); None: not traced.
    trace_id: str | None = None
    # Added to each task's own priority (docs/workflows.md "Priorities").
    priority: int = 0

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def canceling(self) -> bool:
        return self.state is RunState.RUNNING and self.cancel_requested_at is not None

    @property
    def task_count(self) -> int:
        return sum(self.task_counts.values())


@dataclass(frozen=True)
class TaskError:
    """Why a task or attempt failed: the message, whether a retry may help, and what the
    worker kept of the exception (its type, traceback and the action's last log lines;
    None when it sent none, e.g. a lost lease, or when the answer leaves them out:
    GetRun's attempts carry neither, its tasks no log tail; ListAttempts has them all)."""

    message: str
    retryable: bool
    type: str | None = None
    traceback: str | None = None
    log_tail: str | None = None


@dataclass(frozen=True)
class TaskStatus:
    """One task of a run: its state, output (once succeeded) or error. A map task's
    elements are tasks of their own, keyed "<map_parent>[<map_index>]"."""

    key: str
    state: TaskState
    executor_kind: str
    action: str
    depends_on: tuple[str, ...]
    # Attempts started, hand-backs and suspensions included; attempts - hand_backs -
    # suspensions count against max_attempts.
    attempts: int
    max_attempts: int
    output: dict[str, Any] | None
    error: TaskError | None
    retry_at: datetime | None
    finished_at: datetime | None
    # Set when a retry reused this task's output instead of running it: the run it came from.
    reused_from_run_id: str | None = None
    # The task has an output this record does not hold (too large for the answer, and not
    # fetched): Client.get_task_output returns it.
    output_omitted: bool = False
    # Attempts handed back by draining workers, free of charge.
    hand_backs: int = 0
    # Set on a map element: the map task's key and the element's 0-based index.
    map_parent: str | None = None
    map_index: int | None = None
    # Set while the task is WAITING: what for.
    wait: TaskWait | None = None
    # Attempts that ended suspended at a wait, free of charge like hand-backs.
    suspensions: int = 0
    # What replayed step memos saved this task's attempts.
    saved: MemoSavings = field(default_factory=MemoSavings)
    # GetRun, a ready task a limit holds back: why ("waiting for concurrency key ...").
    waiting_for: str | None = None

    @property
    def charged_attempts(self) -> int:
        return charged_attempts(self.attempts, self.hand_backs, self.suspensions)


@dataclass(frozen=True)
class Attempt:
    """One execution of a task by a worker."""

    task_key: str
    attempt: int
    state: AttemptState
    worker_id: str
    dispatch_id: int
    fencing_token: int
    started_at: datetime | None
    deadline: datetime | None
    finished_at: datetime | None
    error: TaskError | None
    # The worker session's name (ListAttempts only; None from GetRun).
    worker_name: str | None = None

    @property
    def handed_back(self) -> bool:
        """Handed back by a draining worker: it ends interrupted, as a lost lease does."""
        return (
            self.state is AttemptState.INTERRUPTED
            and self.error is not None
            and self.error.message == HANDED_BACK
        )


@dataclass(frozen=True)
class RunDetail:
    """A run with its tasks (by key: declared tasks, then each map's elements in index
    order) and attempts (oldest first), as GetRun answers within its 3 MiB budget: what it
    left out is counted (attempts_omitted, tracebacks_omitted, tasks_omitted; Client's
    list_attempts and list_tasks have them all)."""

    run: Run
    tasks: dict[str, TaskStatus]
    attempts: tuple[Attempt, ...]
    tasks_omitted: int = 0
    attempts_omitted: int = 0
    tracebacks_omitted: int = 0

    @property
    def saved(self) -> MemoSavings:
        """What replayed step memos saved the run: its tasks' savings summed."""
        tasks = self.tasks.values()
        return MemoSavings(
            steps=sum(task.saved.steps for task in tasks),
            tokens=sum(task.saved.tokens for task in tasks),
            cost_usd=sum(task.saved.cost_usd for task in tasks),
        )

    def outputs(self) -> dict[str, dict[str, Any]]:
        """The output of every task that succeeded, by task key, however large: never a
        key silently missing. OutputsOmitted when this record does not hold them all
        (it was read with outputs=False)."""
        lacking = tuple(
            key
            for key, task in self.tasks.items()
            if task.state is TaskState.SUCCEEDED and task.output_omitted
        )
        if lacking or self.tasks_omitted:
            shown = ", ".join(repr(key) for key in lacking[:5])
            more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
            raise OutputsOmitted(
                f"run {self.run.id}: this record lacks the outputs of "
                f"{len(lacking)} tasks ({shown}{more}) and lists {self.tasks_omitted} "
                "tasks less than the run has; read it with get_run(run_id) (outputs=True)",
                task_keys=lacking,
                tasks_omitted=self.tasks_omitted,
            )
        return {
            key: task.output
            for key, task in self.tasks.items()
            if task.state is TaskState.SUCCEEDED and task.output is not None
        }


@dataclass(frozen=True)
class TaskPage(Page[TaskStatus]):
    """A page of ListTasks: tracebacks_omitted counts its failed tasks whose traceback
    was left out past the budget (list_attempts has them)."""

    tracebacks_omitted: int = 0


@dataclass(frozen=True)
class Event:
    """One state change of a run (a StateEvent; type "unspecified" when the server
    cannot name it, during an upgrade). The subject's states before and after
    are in ``from_state``/``to_state`` (from_state None: just created; both None for
    run_cancel_requested), of the subject's kind: a RunState, TaskState or AttemptState."""

    run_id: str
    seq: int
    revision: int
    type: EventType
    task_key: str | None
    attempt: int | None
    from_state: RunState | TaskState | AttemptState | None
    to_state: RunState | TaskState | AttemptState | None
    payload: dict[str, Any]
    created_at: datetime | None
