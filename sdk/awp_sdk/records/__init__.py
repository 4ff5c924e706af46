"""What the server answers, as frozen typed values: one record for every answer of every
ControlService call. awp_sdk.decode makes them from the generated messages, and only it.

States are awp_sdk.enums members (StrEnums: ``run.state == "failed"`` holds). Times are
aware datetimes (UTC), None when the API says "not yet". JSON values (inputs, outputs,
payloads) are what the action returned: integral numbers within 2**53 as int
(awp_protocol.jsonvalue). A field the API adds gets its place here first, then in
decode.py, then in whoever renders it (docs/architecture.md).
"""

from awp_sdk.records.durable import Decided, MemoSavings, RunDecision, SignalSent, TaskWait
from awp_sdk.records.fleet import (
    DispatchCount,
    Identity,
    Pruned,
    Stats,
    TaskCount,
    Worker,
)
from awp_sdk.records.limits import LimitsOverview, LimitWaiting, RateLimit
from awp_sdk.records.runs import (
    Attempt,
    Event,
    Page,
    Run,
    RunDetail,
    TaskError,
    TaskPage,
    TaskStatus,
)
from awp_sdk.records.schedules import Schedule, ScheduleTick
from awp_sdk.records.workflows import (
    Applied,
    StoredConcurrency,
    StoredMap,
    StoredRateUse,
    StoredRetry,
    StoredTask,
    StoredWait,
    StoredWorkflow,
)

__all__ = [
    "Applied",
    "Attempt",
    "Decided",
    "DispatchCount",
    "Event",
    "Identity",
    "LimitWaiting",
    "LimitsOverview",
    "MemoSavings",
    "Page",
    "Pruned",
    "RateLimit",
    "Run",
    "RunDecision",
    "RunDetail",
    "Schedule",
    "ScheduleTick",
    "SignalSent",
    "Stats",
    "StoredConcurrency",
    "StoredMap",
    "StoredRateUse",
    "StoredRetry",
    "StoredTask",
    "StoredWait",
    "StoredWorkflow",
    "TaskCount",
    "TaskError",
    "TaskPage",
    "TaskStatus",
    "TaskWait",
    "Worker",
]
