"""Roles, which RPCs each may call, and the credentials file's entries (docs/security.md).

Shared by the server, which enforces them, and the CLI, which mints credentials.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Iterable
from typing import Any, Final


class Role(enum.StrEnum):
    WORKER = "worker"  # Register (the session then authenticates the worker's other calls)
    VIEWER = "viewer"  # read workflows, runs, events, workers, stats
    SUBMITTER = "submitter"  # what a viewer may, and start, cancel and retry runs
    APPROVER = "approver"  # what a viewer may, and decide approvals (docs/design.md §16)
    ADMIN = "admin"  # everything, including creating workflows and pruning runs


READ: Final = frozenset({Role.VIEWER, Role.SUBMITTER, Role.APPROVER, Role.ADMIN})
SUBMIT: Final = frozenset({Role.SUBMITTER, Role.ADMIN})
ADMIN: Final = frozenset({Role.ADMIN})
DECIDE: Final = frozenset({Role.APPROVER, Role.ADMIN})
# Every RPC that needs a credential, and the roles that may make it. WorkerService calls
# after Register carry the session instead; health and reflection are open.
ROLES_OF: Final[dict[str, frozenset[Role]]] = {
    "/awp.v1.WorkerService/Register": frozenset({Role.WORKER, Role.ADMIN}),
    "/awp.v1.ControlService/CreateWorkflow": ADMIN,
    "/awp.v1.ControlService/GetWorkflow": READ,
    "/awp.v1.ControlService/ListWorkflows": READ,
    "/awp.v1.ControlService/StartRun": SUBMIT,
    "/awp.v1.ControlService/StartRuns": SUBMIT,
    "/awp.v1.ControlService/GetRun": READ,
    "/awp.v1.ControlService/ListTasks": READ,
    "/awp.v1.ControlService/GetTaskOutput": READ,
    "/awp.v1.ControlService/ListRuns": READ,
    "/awp.v1.ControlService/CancelRun": SUBMIT,
    "/awp.v1.ControlService/RetryRun": SUBMIT,
    "/awp.v1.ControlService/ListAttempts": READ,
    "/awp.v1.ControlService/WatchRun": READ,
    "/awp.v1.ControlService/ListWorkers": READ,
    "/awp.v1.ControlService/GetStats": READ,
    "/awp.v1.ControlService/PruneRuns": ADMIN,
    "/awp.v1.ControlService/WhoAmI": frozenset(Role),
    "/awp.v1.ControlService/WatchStream": READ,
    # Schedules start runs on their own: managing one is starting runs (docs/schedules.md).
    "/awp.v1.ControlService/CreateSchedule": SUBMIT,
    "/awp.v1.ControlService/GetSchedule": READ,
    "/awp.v1.ControlService/ListSchedules": READ,
    "/awp.v1.ControlService/UpdateSchedule": SUBMIT,
    "/awp.v1.ControlService/PauseSchedule": SUBMIT,
    "/awp.v1.ControlService/ResumeSchedule": SUBMIT,
    "/awp.v1.ControlService/DeleteSchedule": SUBMIT,
    "/awp.v1.ControlService/TriggerSchedule": SUBMIT,
    "/awp.v1.ControlService/BackfillSchedule": SUBMIT,
    # A signal is input to a run, like starting it; a decision is a person's (§16).
    "/awp.v1.ControlService/SendSignal": SUBMIT,
    "/awp.v1.ControlService/Approve": DECIDE,
    "/awp.v1.ControlService/Reject": DECIDE,
    # A rate limit bounds every workflow's work: setting one is the operator's.
    "/awp.v1.ControlService/SetRateLimit": ADMIN,
    "/awp.v1.ControlService/GetRateLimit": READ,
    "/awp.v1.ControlService/ListRateLimits": READ,
}


def token_digest(token: str) -> str:
    """What the credentials file stores of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def mint_token() -> str:
    return secrets.token_urlsafe(32)


def file_entry(name: str, token: str, roles: Iterable[Role]) -> dict[str, Any]:
    """One entry of the credentials file's `credentials:` list."""
    return {"name": name, "token_sha256": token_digest(token), "roles": sorted(map(str, roles))}
