"""What starting a run asks for: one StartRun request, alone (AsyncClient.start) or as
an entry of a batch (AsyncClient.start_many, StartRuns)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from awp.v1 import runs_pb2
from awp_protocol.jsonvalue import JsonInvalid, to_struct
from awp_sdk.errors import json_refused
from awp_sdk.workflow import Workflow


@dataclass(frozen=True)
class RunRequest:
    """One run to start: a workflow (a Workflow, or a name: the latest version unless
    `version` is given), its input, an idempotency key (the same request_id again
    returns the same run), a delayed start (at most one of start_at, start_in: the run
    exists now, its first tasks become ready then, on the database clock) and a priority
    (-10 to 10, added to each task's own; docs/workflows.md "Priorities")."""

    workflow: Workflow | str
    input: Mapping[str, Any] | None = None
    request_id: str | None = None
    version: int | None = None
    start_at: datetime | None = None
    start_in: timedelta | None = None
    priority: int = 0

    def message(self, where: str = "input") -> runs_pb2.StartRunRequest:
        if isinstance(self.workflow, Workflow):
            name, default_version = self.workflow.name, self.workflow.version
        else:
            name, default_version = self.workflow, 0
        request = runs_pb2.StartRunRequest(
            workflow_name=name,
            workflow_version=default_version if self.version is None else self.version,
            input=json_input(self.input, where),
            request_id=self.request_id or "",
            priority=self.priority,
        )
        if self.start_at is not None:
            request.start_time.FromDatetime(self.start_at)
        if self.start_in is not None:
            request.start_delay.FromTimedelta(self.start_in)
        return request


def json_input(value: Mapping[str, Any] | None, where: str) -> Any:
    """A JSON object as a Struct, or InvalidArgument naming what cannot be sent exactly."""
    if value is None:
        return None
    try:
        return to_struct(value, where)
    except JsonInvalid as exc:
        raise json_refused(exc, where) from None
