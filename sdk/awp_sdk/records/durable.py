"""Durable execution as the API shows it (docs/design.md §16): what a waiting task waits
for, what replayed memos saved, and the answers of SendSignal, Approve and Reject."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from awp_sdk.enums import CheckpointKind, TaskState


@dataclass(frozen=True)
class TaskWait:
    """What a WAITING task waits for (TaskStatus.wait): a signal of ``name``, the
    approval ``name`` (its ``prompt``, and ``role``: who besides admins may decide), or a
    sleep. ``due_at``: when a sleep wakes, or when a signal or approval wait times out
    (None: never). ``attempt``: the attempt that suspended (0 for a wait task no worker
    runs)."""

    kind: CheckpointKind
    name: str
    prompt: str
    role: str
    since: datetime | None
    due_at: datetime | None
    attempt: int


@dataclass(frozen=True)
class MemoSavings:
    """What replayed step memos saved a task's attempts: the steps not run again, and
    the tokens and cost those steps had reported."""

    steps: int = 0
    tokens: int = 0
    cost_usd: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.steps or self.tokens or self.cost_usd)


@dataclass(frozen=True)
class SignalSent:
    """SendSignal's answer: the signal's id (a run's signals of one name are consumed in
    id order), the task whose wait consumed it at once (None: buffered until a wait for
    its name is reached), and duplicate when its request id had sent it already."""

    signal_id: int
    delivered_to: str | None
    duplicate: bool


@dataclass(frozen=True)
class Decided:
    """Approve's or Reject's answer: the task after the decision (READY, or for a wait
    task SUCCEEDED / FAILED), the attempt whose wait it resumed (0 for a wait task), and
    when it was made."""

    task_state: TaskState
    resumed_attempt: int
    decided_at: datetime | None


@dataclass(frozen=True)
class RunDecision:
    """A decision made on an approval, as the run's events record it: the task, approved
    or rejected, who decided (the credential's name), the comment, the attempt whose
    wait it resumed (None for a wait task no worker runs) and when."""

    task_key: str
    approved: bool
    decided_by: str
    comment: str
    resumed_attempt: int | None
    decided_at: datetime | None
