"""The requests that resume waiting tasks (docs/design.md §16), a signal to a run and a
decision on an approval, which AsyncClient's send_signal, approve and reject send; and
the decisions a run's events record, which AsyncClient.decisions reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from awp.v1 import durable_pb2
from awp_protocol.jsonvalue import JsonInvalid, to_value
from awp_sdk.errors import json_refused
from awp_sdk.records import Event, RunDecision, TaskStatus

if TYPE_CHECKING:
    from awp_sdk.client import AsyncClient


def signal_request(
    run_id: str, name: str, payload: Any, request_id: str | None
) -> durable_pb2.SendSignalRequest:
    """The SendSignal request; InvalidArgument naming where a payload is no JSON value
    that can be sent exactly."""
    try:
        value = to_value(payload, "payload")
    except JsonInvalid as exc:
        raise json_refused(exc, "payload") from None
    return durable_pb2.SendSignalRequest(
        run_id=run_id, name=name, payload=value, request_id=request_id or ""
    )


def decision(
    run_id: str, task_key: str, comment: str, *, approve: bool
) -> durable_pb2.ApproveRequest | durable_pb2.RejectRequest:
    kind = durable_pb2.ApproveRequest if approve else durable_pb2.RejectRequest
    return kind(run_id=run_id, task_key=task_key, comment=comment)


def asked_for_decision(task: TaskStatus) -> bool:
    """Whether the task may have had a decision made on it: it waits or waited (an
    action's approval suspends its attempt), or it is a wait task (no executor)."""
    return task.wait is not None or task.suspensions > 0 or not task.executor_kind


def decision_of(event: Event) -> RunDecision | None:
    """The decision an event records (its payload says "approved"), else None."""
    payload = event.payload
    approved = payload.get("approved")
    if event.task_key is None or not isinstance(approved, bool):
        return None
    resumed = payload.get("resumed_attempt")
    return RunDecision(
        task_key=event.task_key,
        approved=approved,
        decided_by=str(payload.get("decided_by") or payload.get("by") or ""),
        comment=str(payload.get("comment") or ""),
        resumed_attempt=resumed if isinstance(resumed, int) and resumed > 0 else None,
        decided_at=event.created_at,
    )


async def decisions(client: AsyncClient, run_id: str, task_key: str | None) -> list[RunDecision]:
    last_seq = (await client.get_run(run_id, outputs=False)).run.last_seq
    found: list[RunDecision] = []
    if last_seq == 0:
        return found
    events = client.watch(run_id, give_up_after=0)
    try:
        async for event in events:
            decision = decision_of(event)
            if decision is not None and task_key in (None, decision.task_key):
                found.append(decision)
            if event.seq >= last_seq:
                break
    finally:
        # Ends the WatchRun call now: the run may go on for days.
        await events.aclose()
    return found
