"""Leases a worker holds: local deadline arithmetic and the table heartbeats list.

Every deadline here is a local monotonic instant computed from the *remaining
durations* the server sends (never from its absolute timestamps), so clock skew
between machines cannot matter. An estimate ``receipt time + remaining`` lags the
server's truth by the one-way latency; the safety margin absorbs that.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import duration_pb2

from awp.v1 import worker_pb2
from awp_protocol.limits import MAX_WORKER_CONCURRENCY
from awp_sdk.actions import ActionContext
from awp_worker._checkpoints import LeaseCheckpoints
from awp_worker._stream import StreamWriter


class StandDown(enum.StrEnum):
    """Every way a worker gives up a lease that is no longer its own, reporting no result
    the server would accept. The log line that says so carries it as ``stood_down``, so
    a test that freezes a worker can tell any of them from a result it wrongly kept."""

    # The lease could not be confirmed before its local safety deadline.
    SAFETY_DEADLINE = "safety_deadline"
    # A heartbeat (or the final Drain) answered that the server no longer counts it.
    REVOKED = "revoked"
    # Complete (or the upstream fetch before the action) answered LEASE_LOST.
    LEASE_LOST = "lease_lost"
    # The whole session ended (marked offline while silent): every lease with it.
    SESSION_LOST = "session_lost"


# The structured log field that names a StandDown.
STOOD_DOWN = "stood_down"


def seconds(duration: duration_pb2.Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


@dataclass
class LeaseClock:
    """Where one lease's local deadlines stand.

    ``safety_deadline = min(lease expiry, attempt deadline) - margin``: past it the
    worker may no longer own the lease, so it must stop working. Renewals move the
    lease expiry; nothing moves the attempt deadline later.
    """

    margin: float
    lease_expiry: float
    attempt_deadline: float

    @classmethod
    def start(
        cls, now: float, lease_remaining: float, attempt_remaining: float, safety_margin: float
    ) -> LeaseClock:
        # A task whose whole window is shorter than twice the margin would never get to
        # run at all; for those the margin shrinks to half the window.
        window = max(0.0, min(lease_remaining, attempt_remaining))
        margin = max(0.0, min(safety_margin, window / 2))
        return cls(margin, now + lease_remaining, now + attempt_remaining)

    @property
    def safety_deadline(self) -> float:
        return min(self.lease_expiry, self.attempt_deadline) - self.margin

    @property
    def attempt_safety_deadline(self) -> float:
        """The latest the work can go on however often the lease is renewed."""
        return self.attempt_deadline - self.margin

    def renew(self, now: float, lease_remaining: float, attempt_remaining: float | None) -> float:
        """Apply a RENEWED answer received at ``now``; returns the new safety deadline."""
        self.lease_expiry = now + lease_remaining
        if attempt_remaining is not None:
            self.attempt_deadline = min(self.attempt_deadline, now + attempt_remaining)
        return self.safety_deadline

    def expired(self, now: float) -> bool:
        return now >= self.safety_deadline


class Phase(enum.Enum):
    RUNNING = "running"  # the executor works on it
    REPORTING = "reporting"  # the result waits for (or is in) a Complete


@dataclass(eq=False)
class HeldLease:
    """One lease from Claim until its Complete is answered or the lease is given up."""

    lease: worker_pb2.Lease
    clock: LeaseClock
    ctx: ActionContext
    log_fields: dict[str, Any]
    phase: Phase = Phase.RUNNING
    task: asyncio.Task[None] | None = None
    timeout: asyncio.Timeout | None = None
    result: worker_pb2.TaskResult | None = None
    # The attempt's output stream (ctx.stream), once the attempt runs.
    stream: StreamWriter | None = None
    # The attempt's checkpoints on the wire (ctx.replay's store).
    checkpoints: LeaseCheckpoints | None = None
    # Why the runtime cancelled the executor ("revoked", "shutdown", ...); None: it did not.
    cancel_reason: str | None = None

    @property
    def dispatch_id(self) -> int:
        return self.lease.dispatch_id

    def ref(self) -> worker_pb2.LeaseRef:
        return worker_pb2.LeaseRef(
            dispatch_id=self.lease.dispatch_id, lease_token=self.lease.lease_token
        )

    def reschedule(self) -> None:
        """Move the running executor's timeout to the current safety deadline."""
        timeout = self.timeout
        if timeout is None or timeout.expired():
            return
        # RuntimeError: the timeout block already exited; nothing left to move.
        with contextlib.suppress(RuntimeError):
            timeout.reschedule(self.clock.safety_deadline)

    def cancel(self, reason: str) -> bool:
        """Stop the executor (if it still runs); True if there was one to stop."""
        self.ctx._cancel()
        if self.task is None or self.task.done():
            return False
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.task.cancel()
        return True


# Revocations kept for leases not held yet: more than a session holds at once.
MAX_EARLY_REVOCATIONS = MAX_WORKER_CONCURRENCY


class LeaseTable:
    """The leases this session holds (``len()`` is the number of occupied slots), and
    those it gave up locally that the server may still count as held."""

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._leases: dict[int, HeldLease] = {}
        self._on_release = on_release
        # Counts every release, so a waiter can tell that a slot freed since it looked.
        self.releases = 0
        # Given up locally (safety deadline, rejected result): dispatch id -> (ref, local
        # lease expiry). Handed back in the last Drain; forgotten once the server has
        # surely settled them.
        self._abandoned: dict[int, tuple[worker_pb2.LeaseRef, float]] = {}
        # Revocations that arrived before their lease did (a push on the heartbeat
        # stream can overtake the Claim answer carrying the lease): dispatch id -> status,
        # the newest MAX_EARLY_REVOCATIONS. Dispatch ids are never leased twice.
        self._revoked_early: dict[int, str] = {}

    def add(self, held: HeldLease) -> None:
        self._leases[held.dispatch_id] = held

    def get(self, dispatch_id: int) -> HeldLease | None:
        return self._leases.get(dispatch_id)

    def holds(self, held: HeldLease) -> bool:
        return self._leases.get(held.dispatch_id) is held

    def release(self, held: HeldLease) -> bool:
        """Forget ``held``; frees its slot. False if it was already released."""
        if not self.holds(held):
            return False
        del self._leases[held.dispatch_id]
        self.releases += 1
        self._on_release()
        return True

    def abandon(self, held: HeldLease) -> None:
        """Stop holding a lease the worker can no longer vouch for (no report); the
        last Drain hands it back so that it is retried at once."""
        if not self.release(held):
            return
        now = asyncio.get_running_loop().time()
        # The reaper settles expired leases within seconds; a minute later a hand-back
        # of them would be a no-op, so the list stays small on a long-lived worker.
        stale = [d for d, (_, expiry) in self._abandoned.items() if expiry < now - 60.0]
        for dispatch_id in stale:
            del self._abandoned[dispatch_id]
        self._abandoned[held.dispatch_id] = (held.ref(), held.clock.lease_expiry)

    def revoked_before_held(self, dispatch_id: int, status: str) -> None:
        """The server revoked a lease this session does not hold (yet, or any more)."""
        self._revoked_early[dispatch_id] = status
        if len(self._revoked_early) > MAX_EARLY_REVOCATIONS:
            del self._revoked_early[next(iter(self._revoked_early))]

    def take_early_revocation(self, dispatch_id: int) -> str | None:
        """The status the server revoked this lease with before it was held, if it did."""
        return self._revoked_early.pop(dispatch_id, None)

    def abandoned_refs(self) -> list[worker_pb2.LeaseRef]:
        # The server settles only leases still held by this session; stale refs are
        # ignored, so every abandoned one can go.
        return [ref for ref, _ in self._abandoned.values()]

    def refs(self) -> list[worker_pb2.LeaseRef]:
        return [held.ref() for held in self._leases.values()]

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[HeldLease]:
        return iter(list(self._leases.values()))
