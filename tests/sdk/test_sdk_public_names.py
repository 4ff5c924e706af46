"""The SDK's public names, pinned: adding, renaming or removing one fails here, so that a
change of the API users import is a decision (this list edited in the same commit), never
an accident. What counts: awp_sdk.__all__; each module's top-level names not starting
with "_" (type variables aside); the methods of the clients and run handles; and the
fields of every record, which users read by name."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import awp_sdk
from awp_sdk import records

ALL = (
    "ActionCancelled ActionContext Applied AsyncClient AsyncRunHandle Attempt AttemptBoundary "
    "AttemptState CheckpointKind Decided Decision MemoLimit MemoSavings NotWaiting RunDecision "
    "RunFinished RunRequest SignalSent StoredWait TaskWait "
    "AwpError Client Concurrency Conflict Connection DeadlineExceeded DefinitionConflict "
    "DefinitionInvalid "
    "DispatchCount DispatchState Event EventType FailedPrecondition FailurePolicy Identity "
    "InvalidArgument LeaseLost Map NotFound OutputStream OutputsOmitted Page PermanentError "
    "PermissionDenied ProtocolUnsupported Pruned Rate RequestIdConflict Retry RetryableError Run "
    "RunCanceled RunDetail RunFailed RunHandle RunNotFinished RunNotFound RunState Stats "
    "StoredConcurrency StoredMap StoredRateUse StoredRetry StoredTask StoredWorkflow "
    "StreamChunk StreamItem "
    "StreamLimit Task "
    "TaskCount TaskError TaskFunction "
    "TaskOptions TaskPage TaskState TaskStatus Unauthenticated Unavailable UnknownEnumValue "
    "WaitTimedOut WaitTimeout Worker WorkerDraining WorkerState Workflow WorkflowNotFound "
    "action step"
)

MODULES = {
    "awp_sdk.actions": "ActionCancelled ActionContext ActionFunc ActionRegistry "
    "DEFAULT_REGISTRY OutputError OutputStream PermanentError RegisteredAction RetryableError "
    "action current_context output_struct running stream_chunk",
    "awp_sdk.client": "AsyncClient WorkflowLike definition_of every_item",
    "awp_sdk.starts": "RunRequest json_input",
    "awp_sdk.connection": "Channel Connection DEFAULT_ADDRESS DEFAULT_PORT iterate server_address",
    "awp_sdk.decode": "applied attempt decided event identity limits_overview memo_savings "
    "message_json pruned rate_limit run run_detail schedule signal_sent span stats task task_error "
    "task_page task_wait when worker workflow",
    "awp_sdk.definitions": "Definition MAX_UINT32 OnFailure POLICIES Path_ canonical_key "
    "definition parse_field render_path to_duration unwrap validate",
    "awp_sdk.enums": "AttemptState CatchupPolicy CheckpointKind DispatchState EventType "
    "FailurePolicy OverlapPolicy RunState TaskState WorkerState decode encode",
    "awp_sdk.errors": "AwpError BY_REASON Conflict DeadlineExceeded DefinitionConflict "
    "DefinitionInvalid FailedPrecondition InvalidArgument LeaseLost MemoLimit NotFound "
    "NotWaiting OutputsOmitted RunFinished json_refused "
    "PermissionDenied ProtocolUnsupported RateLimitNotFound RequestIdConflict RunCanceled "
    "RunFailed RunNotFinished RunNotFound START_HINT ScheduleExists ScheduleNotFound StreamLimit "
    "Unauthenticated Unavailable "
    "UnknownEnumValue "
    "WaitTimeout WorkerDraining WorkflowNotFound from_rpc_error is_transient one_line",
    "awp_sdk.handle": "AsyncRunHandle OUTPUT_FETCHES complete_outputs first_failure "
    "last_attempt_error outcome",
    "awp_sdk.records": "",
    "awp_sdk.records.durable": "Decided MemoSavings RunDecision SignalSent TaskWait",
    "awp_sdk.records.fleet": "DispatchCount Identity Pruned Stats TaskCount Worker",
    "awp_sdk.records.runs": "Attempt Event Page Run RunDetail TaskError TaskPage TaskStatus",
    "awp_sdk.records.schedules": "Schedule ScheduleTick",
    "awp_sdk.records.limits": "LimitWaiting LimitsOverview RateLimit",
    "awp_sdk.limits": "RateLimits",
    "awp_sdk.placement": "ALIASES Path_ TASK_KEYS read workflow_sticky",
    "awp_sdk.replay": "Checkpoint CheckpointStore KINDS Kind Replay Savings Usage",
    "awp_sdk.schedules": "Catchup Overlap Schedules",
    "awp_sdk.steps": "UsageSpec run_step step",
    "awp_sdk.threads": "call_from_thread",
    "awp_sdk.records.workflows": "Applied StoredConcurrency StoredMap StoredRateUse "
    "StoredRetry StoredTask StoredWait StoredWorkflow",
    "awp_sdk.streams": "AttemptBoundary StreamChunk StreamItem task_stream",
    "awp_sdk.sync": "Client RunHandle",
    "awp_sdk.testing": "ActionEnvironment",
    "awp_sdk.watch": "GIVE_UP_AFTER_S RECONNECT_INITIAL_S RECONNECT_MAX_S ReconnectHandler "
    "run_events",
    "awp_sdk.resumes": "asked_for_decision decision decision_of decisions signal_request",
    "awp_sdk.wire": "applied attempts backfilled decided event pruned rate_limit rate_limits "
    "run run_detail runs schedule schedule_deleted schedules signal_sent started stats tasks "
    "triggered workers workflow workflows",
    "awp_sdk.waits": "Decision Duration WaitSpec WaitSuspended WaitTimedOut duration_ms "
    "sleep wait_for_approval wait_for_signal",
    "awp_sdk.workflow": "Concurrency Duration Map Rate Retry Task TaskFunction TaskOptions "
    "Workflow check_options",
}

CLIENT_METHODS = (
    "apply approve as_caller call cancel close control decisions get_run get_stats get_task_output "
    "get_workflow "
    "list_attempts list_attempts_page list_runs list_runs_page list_tasks list_tasks_page "
    "list_workers list_workflows list_workflows_page prune_runs reject retry run "
    "send_signal start start_many stream "
    "task_stream watch who_am_i"
)
HANDLE_METHODS = "cancel get result signal stream watch"

RECORD_FIELDS = {
    "Applied": "name version created workflow",
    "Attempt": "task_key attempt state worker_id dispatch_id fencing_token started_at "
    "deadline finished_at error worker_name",
    "DispatchCount": "state executor_kind count",
    "Event": "run_id seq revision type task_key attempt from_state to_state payload created_at",
    "Identity": "name roles credentials_required",
    "Page": "items next_page_token",
    "Pruned": "runs tasks attempts dispatches events remaining cutoff next_page_token",
    "Run": "id workflow version state input request_id revision last_seq created_at "
    "finished_at cancel_requested_at started_by cancel_requested_by task_counts "
    "retried_from_run_id retry_from_task schedule_id schedule_tick start_time trace_id priority",
    "Schedule": "id name workflow version input cron every timezone overlap catchup "
    "catchup_window paused next_fire_at created_at created_by updated_at updated_by "
    "recent_ticks",
    "ScheduleTick": "at source outcome run_id leader_epoch created_at",
    "RunDetail": "run tasks attempts tasks_omitted attempts_omitted tracebacks_omitted",
    "Stats": "tasks_by_state dispatches_by_state runs_by_state workers_by_state "
    "active_leases oldest_pending",
    "StoredConcurrency": "key max",
    "RateLimit": "name units period used paused_until updated_at updated_by",
    "LimitWaiting": "name waiting",
    "LimitsOverview": "limits rate_limits_waiting keys_waiting",
    "StoredMap": "over path",
    "StoredRateUse": "limit units",
    "StoredRetry": "max_attempts initial_backoff max_backoff multiplier",
    "StoredTask": "key executor_kind action input depends_on retry timeout map on_failure always "
    "concurrency_limits rate_limits wait priority required_labels preferred_labels resources "
    "sticky",
    "StoredWait": "kind sleep prompt timeout role",
    "TaskWait": "kind name prompt role since due_at attempt",
    "MemoSavings": "steps tokens cost_usd",
    "SignalSent": "signal_id delivered_to duplicate",
    "Decided": "task_state resumed_attempt decided_at",
    "RunDecision": "task_key approved decided_by comment resumed_attempt decided_at",
    "StoredWorkflow": "name version description concurrency tasks created_at definition",
    "TaskCount": "state executor_kind count",
    "TaskError": "message retryable type traceback log_tail",
    "TaskPage": "items next_page_token tracebacks_omitted",
    "TaskStatus": "key state executor_kind action depends_on attempts max_attempts output "
    "error retry_at finished_at reused_from_run_id output_omitted hand_backs map_parent "
    "map_index wait suspensions saved waiting_for",
    "Worker": "id name state executor_kinds max_concurrency active_leases labels "
    "protocol_version registered_at last_heartbeat_at stopped_at models resources reserved",
}


def public_names(module: Any) -> list[str]:
    """The module's own top-level definitions (imports are someone else's)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return sorted(
        name
        for name in names
        if not name.startswith("_")
        and name != "__all__"
        and not isinstance(getattr(module, name), TypeVar | ParamSpec)
    )


def test_the_package_exports_exactly_these_names() -> None:
    assert sorted(awp_sdk.__all__) == sorted(ALL.split())
    assert all(hasattr(awp_sdk, name) for name in awp_sdk.__all__)


def test_each_module_defines_exactly_these_public_names() -> None:
    found = {
        info.name: public_names(importlib.import_module(info.name))
        for info in pkgutil.walk_packages(awp_sdk.__path__, "awp_sdk.")
    }
    assert found == {module: sorted(names.split()) for module, names in MODULES.items()}


def test_the_clients_and_handles_have_exactly_these_methods() -> None:
    def methods(cls: type) -> list[str]:
        return sorted(name for name, _ in inspect.getmembers(cls) if not name.startswith("_"))

    assert methods(awp_sdk.AsyncClient) == sorted([*CLIENT_METHODS.split(), "channel"])
    sync_only = {"as_caller", "call", "stream", "control", "channel"}
    assert methods(awp_sdk.Client) == sorted(set(CLIENT_METHODS.split()) - sync_only)
    assert methods(awp_sdk.AsyncRunHandle) == sorted(HANDLE_METHODS.split())
    assert methods(awp_sdk.RunHandle) == sorted(HANDLE_METHODS.split())


def test_every_record_has_exactly_these_fields_in_this_order() -> None:
    assert sorted(records.__all__) == sorted(RECORD_FIELDS)
    for name, fields in RECORD_FIELDS.items():
        record = getattr(records, name)
        assert dataclasses.fields(record), name
        assert [f.name for f in dataclasses.fields(record)] == fields.split(), name
        assert record.__dataclass_params__.frozen, f"{name} is not frozen"
