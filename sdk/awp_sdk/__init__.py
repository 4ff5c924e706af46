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
    CheckpointKind,
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
    MemoLimit,
    NotFound,
    NotWaiting,
    OutputsOmitted,
    PermissionDenied,
    ProtocolUnsupported,
    RequestIdConflict,
    RunCanceled,
    RunFailed,
    RunFinished,
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
    Decided,
    DispatchCount,
    Event,
    Identity,
    MemoSavings,
    Page,
    Pruned,
    Run,
    RunDecision,
    RunDetail,
    SignalSent,
    Stats,
    StoredConcurrency,
    StoredMap,
    StoredRateUse,
    StoredRetry,
    StoredTask,
    StoredWait,
    StoredWorkflow,
    TaskCount,
    TaskError,
    TaskPage,
    TaskStatus,
    TaskWait,
    Worker,
)
from awp_sdk.starts import RunRequest
from awp_sdk.steps import step
from awp_sdk.streams import AttemptBoundary, StreamChunk, StreamItem
from awp_sdk.sync import Client, RunHandle
from awp_sdk.waits import Decision, WaitTimedOut
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
    "CheckpointKind",
    "Client",
    "Concurrency",
    "Conflict",
    "Connection",
    "DeadlineExceeded",
    "Decided",
    "Decision",
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
    "MemoLimit",
    "MemoSavings",
    "NotFound",
    "NotWaiting",
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
    "RunDecision",
    "RunDetail",
    "RunFailed",
    "RunFinished",
    "RunHandle",
    "RunNotFinished",
    "RunNotFound",
    "RunRequest",
    "RunState",
    "SignalSent",
    "Stats",
    "StoredConcurrency",
    "StoredMap",
    "StoredRateUse",
    "StoredRetry",
    "StoredTask",
    "StoredWait",
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
    "TaskWait",
    "Unauthenticated",
    "Unavailable",
    "UnknownEnumValue",
    "WaitTimedOut",
    "WaitTimeout",
    "Worker",
    "WorkerDraining",
    "WorkerState",
    "Workflow",
    "WorkflowNotFound",
    "action",
    "step",
]
