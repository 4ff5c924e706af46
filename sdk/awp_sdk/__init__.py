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
from awp_sdk.client import AsyncClient
from awp_sdk.connection import Connection
from awp_sdk.enums import (
    AttemptState,
    DispatchState,
    EventType,
    FailurePolicy,
    RunState,
    TaskState,
    WorkerState,
)
from awp_sdk.errors import (
    AwpError,
    Conflict,
    DeadlineExceeded,
    DefinitionConflict,
    DefinitionInvalid,
    FailedPrecondition,
    InvalidArgument,
    LeaseLost,
    NotFound,
    OutputsOmitted,
    PermissionDenied,
    ProtocolUnsupported,
    RequestIdConflict,
    RunCanceled,
    RunFailed,
    RunNotFinished,
    RunNotFound,
    StreamLimit,
    Unauthenticated,
    Unavailable,
    UnknownEnumValue,
    WaitTimeout,
    WorkerDraining,
    WorkflowNotFound,
)
from awp_sdk.handle import AsyncRunHandle
from awp_sdk.records import (
    Applied,
    Attempt,
    DispatchCount,
    Event,
    Identity,
    Page,
    Pruned,
    Run,
    RunDetail,
    Stats,
    StoredConcurrency,
    StoredMap,
    StoredRateUse,
    StoredRetry,
    StoredTask,
    StoredWorkflow,
    TaskCount,
    TaskError,
    TaskPage,
    TaskStatus,
    Worker,
)
from awp_sdk.streams import AttemptBoundary, StreamChunk, StreamItem
from awp_sdk.sync import Client, RunHandle
from awp_sdk.workflow import (
    Concurrency,
    Map,
    Rate,
    Retry,
    Task,
    TaskFunction,
    TaskOptions,
    Workflow,
)

__all__ = [
    "ActionCancelled",
    "ActionContext",
    "Applied",
    "AsyncClient",
    "AsyncRunHandle",
    "Attempt",
    "AttemptBoundary",
    "AttemptState",
    "AwpError",
    "Client",
    "Concurrency",
    "Conflict",
    "Connection",
    "DeadlineExceeded",
    "DefinitionConflict",
    "DefinitionInvalid",
    "DispatchCount",
    "DispatchState",
    "Event",
    "EventType",
    "FailedPrecondition",
    "FailurePolicy",
    "Identity",
    "InvalidArgument",
    "LeaseLost",
    "Map",
    "NotFound",
    "OutputStream",
    "OutputsOmitted",
    "Page",
    "PermanentError",
    "PermissionDenied",
    "ProtocolUnsupported",
    "Pruned",
    "Rate",
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
    "RunState",
    "Stats",
    "StoredConcurrency",
    "StoredMap",
    "StoredRateUse",
    "StoredRetry",
    "StoredTask",
    "StoredWorkflow",
    "StreamChunk",
    "StreamItem",
    "StreamLimit",
    "Task",
    "TaskCount",
    "TaskError",
    "TaskFunction",
    "TaskOptions",
    "TaskPage",
    "TaskState",
    "TaskStatus",
    "Unauthenticated",
    "Unavailable",
    "UnknownEnumValue",
    "WaitTimeout",
    "Worker",
    "WorkerDraining",
    "WorkerState",
    "Workflow",
    "WorkflowNotFound",
    "action",
]
