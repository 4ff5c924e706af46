"""Wait tasks (docs/design.md §16): a task that is a wait of its own, run by no worker
(TaskDefinition.wait). Once ready it is WAITING at once: a sleep SUCCEEDS when its time
has passed, an approval SUCCEEDS when approved and FAILS (not retryable, the task's
on_failure applies) when rejected or timed out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from awp_protocol.errors import FieldViolation
from awp_protocol.limits import MAX_PROMPT_CHARS, MAX_WAIT_MS

WaitTaskKind = Literal["sleep", "approval"]
# The roles an approval may ask for: "" (approvers and admins) or admin only.
APPROVAL_ROLES = ("", "approver", "admin")
# The checkpoint name of a wait task's approval (an action names its own).
WAIT_TASK_APPROVAL = "approval"


@dataclass(frozen=True, slots=True)
class WaitTaskSpec:
    kind: WaitTaskKind
    sleep_ms: int | None = None
    prompt: str = ""
    timeout_ms: int | None = None
    role: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.sleep_ms is not None:
            data["sleep_ms"] = self.sleep_ms
        if self.prompt:
            data["prompt"] = self.prompt
        if self.timeout_ms is not None:
            data["timeout_ms"] = self.timeout_ms
        if self.role:
            data["role"] = self.role
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WaitTaskSpec:
        return cls(
            kind=data["kind"],
            sleep_ms=data.get("sleep_ms"),
            prompt=data.get("prompt", ""),
            timeout_ms=data.get("timeout_ms"),
            role=data.get("role", ""),
        )

    @property
    def due_in_ms(self) -> int | None:
        """When the wait ends without its condition, from the moment it is ready."""
        return self.sleep_ms if self.kind == "sleep" else self.timeout_ms


def wait_violations(where: str, wait: WaitTaskSpec) -> list[FieldViolation]:
    """What is wrong with a wait task's wait (`where`: the task's field path)."""
    found: list[FieldViolation] = []

    def bad(field_name: str, description: str) -> None:
        found.append(FieldViolation(f"{where}.wait.{field_name}", description))

    if wait.kind not in ("sleep", "approval"):
        bad("kind", "must be SLEEP or APPROVAL")
        return found
    if wait.kind == "sleep":
        if wait.sleep_ms is None or not 0 <= wait.sleep_ms <= MAX_WAIT_MS:
            bad("sleep", f"a sleep task needs a sleep between 0 and {MAX_WAIT_MS} ms")
        if wait.prompt or wait.timeout_ms is not None or wait.role:
            bad("prompt", "a sleep task has no prompt, timeout or role")
        return found
    if wait.sleep_ms is not None:
        bad("sleep", "an approval task has no sleep")
    if not 0 < len(wait.prompt) <= MAX_PROMPT_CHARS:
        bad("prompt", f"an approval task needs a prompt of 1 to {MAX_PROMPT_CHARS} characters")
    if wait.timeout_ms is not None and not 0 < wait.timeout_ms <= MAX_WAIT_MS:
        bad("timeout", f"must be between 1 and {MAX_WAIT_MS} ms")
    if wait.role not in APPROVAL_ROLES:
        bad("role", "must be empty, 'approver' or 'admin'")
    return found
