"""awp_sdk: AWP for application code — workflows in code, actions, and a client.

    from awp_sdk import ActionContext, Client, Workflow

    wf = Workflow("hello", version=1)

    @wf.task(timeout="30s")
    def greet(ctx: ActionContext, input: dict) -> dict:
        return {"greeting": f"hello, {ctx.run_input['name']}"}

    with Client() as client:                      # AWP_ADDRESS, else 127.0.0.1:50051
        client.apply(wf)
        print(client.start(wf, input={"name": "Ada"}).result(timeout=60))

Run the actions with ``awp-worker --module <this module>``. See docs/sdk.md.
"""

from __future__ import annotations

from awp_sdk.actions import (
    ActionCancelled,
    ActionContext,
    OutputStream,
    PermanentError,
    RetryableError,
    action,
)
from awp_sdk.client import Applied, AsyncClient, AsyncRunHandle
from awp_sdk.connection import Connection
from awp_sdk.errors import (
    AwpError,
    Conflict,
    DeadlineExceeded,
    DefinitionConflict,
    DefinitionInvalid,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RequestIdConflict,
    RunCanceled,
    RunFailed,
    RunNotFinished,
    RunNotFound,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
    WorkflowNotFound,
)
from awp_sdk.records import Attempt, Event, Run, RunDetail, TaskError, TaskStatus
from awp_sdk.streams import AttemptBoundary, StreamChunk, StreamItem
from awp_sdk.sync import Client, RunHandle
from awp_sdk.workflow import Map, Retry, Task, TaskFunction, TaskOptions, Workflow

__all__ = [
    "ActionCancelled",
    "ActionContext",
    "Applied",
    "AsyncClient",
    "AsyncRunHandle",
    "Attempt",
    "AttemptBoundary",
    "AwpError",
    "Client",
    "Conflict",
    "Connection",
    "DeadlineExceeded",
    "DefinitionConflict",
    "DefinitionInvalid",
    "Event",
    "FailedPrecondition",
    "InvalidArgument",
    "Map",
    "NotFound",
    "OutputStream",
    "PermanentError",
    "PermissionDenied",
    "RequestIdConflict",
    "Retry",
    "RetryableError",
    "Run",
    "RunCanceled",
    "RunDetail",
    "RunFailed",
    "RunHandle",
    "RunNotFinished",
    "RunNotFound",
    "StreamChunk",
    "StreamItem",
    "Task",
    "TaskError",
    "TaskFunction",
    "TaskOptions",
    "TaskStatus",
    "Unauthenticated",
    "Unavailable",
    "WaitTimeout",
    "Workflow",
    "WorkflowNotFound",
    "action",
]
