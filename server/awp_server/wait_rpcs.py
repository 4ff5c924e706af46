"""Durable waits on the wire (durable.proto and checkpoints.proto, docs/design.md §16):
WorkerService.Await's conversions, and ControlService's SendSignal, Approve and Reject
with their checks and audit lines. The rules and the storage are awp_db.waits'.
"""

from __future__ import annotations

import logging
from typing import Final

from google.protobuf import json_format

from awp.v1 import checkpoints_pb2, durable_pb2
from awp_db import waits, workers
from awp_db.connect import Pool
from awp_db.runs import parse_run_id
from awp_kernel import errors
from awp_kernel.errors import invalid
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import canonical_json, parse_value
from awp_protocol.limits import MAX_SIGNAL_PAYLOAD_BYTES, MAX_WAIT_MS
from awp_protocol.names import (
    CHECKPOINT_NAME_PATTERN,
    CHECKPOINT_NAME_RULE,
    TASK_KEY_PATTERN,
    TASK_KEY_RULE,
)
from awp_protocol.results import Replayed, check_cost
from awp_protocol.roles import Role
from awp_server import control_requests as requests
from awp_server.auth import caller, caller_credential
from awp_server.checkpoint_rpcs import checkpoint_message
from awp_server.control_service import Context
from awp_server.convert import CHECKPOINT_KINDS, TASK_STATES, timestamp
from awp_server.errors import unary
from awp_server.schedule_rpcs import ControlServiceWithSchedules

# The roles an approval may ask for besides admin: "" is the default, approver.
WAIT_ROLES: Final = ("", Role.APPROVER.value, Role.ADMIN.value)
_AWAITED: Final = {
    waits.AwaitOutcome.SATISFIED: checkpoints_pb2.AWAIT_OUTCOME_SATISFIED,
    waits.AwaitOutcome.SUSPENDED: checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED,
    waits.AwaitOutcome.LEASE_LOST: checkpoints_pb2.AWAIT_OUTCOME_LEASE_LOST,
}

log = logging.getLogger("awp.server.waits")


def _ms(field: str, request: checkpoints_pb2.AwaitRequest) -> int | None:
    if not request.HasField(field):  # type: ignore[arg-type]
        return None
    value = getattr(request, field).ToMilliseconds()
    if not 0 <= value <= MAX_WAIT_MS:
        raise invalid(field, f"must be between 0 and {MAX_WAIT_MS} ms")
    return int(value)


def wait_of(request: checkpoints_pb2.AwaitRequest) -> waits.Wait:
    """The wait an Await names, or INVALID_ARGUMENT naming the field."""
    kind = CHECKPOINT_KINDS.name(request.kind)
    if kind not in ("sleep", "signal", "approval"):
        raise invalid("kind", "must be SLEEP, SIGNAL or APPROVAL")
    if kind == "sleep":
        if request.name:
            raise invalid("name", "must be empty for a sleep")
        if not request.HasField("sleep"):
            raise invalid("sleep", "a sleep needs its length")
    elif not CHECKPOINT_NAME_PATTERN.fullmatch(request.name):
        raise invalid("name", f"must be {CHECKPOINT_NAME_RULE}")
    if kind != "approval" and (request.prompt or request.role):
        raise invalid("prompt", "only an approval has a prompt and a role")
    if request.role not in WAIT_ROLES:
        raise invalid("role", "must be empty, 'approver' or 'admin'")
    return waits.Wait(
        kind=kind,
        name=request.name,
        occurrence=request.occurrence,
        due_in_ms=_ms("sleep", request) if kind == "sleep" else _ms("timeout", request),
        prompt=request.prompt,
        role=request.role,
    )


async def await_wait(
    pool: Pool, worker_id: str, session_token: str, request: checkpoints_pb2.AwaitRequest
) -> checkpoints_pb2.AwaitResponse:
    wait = wait_of(request)
    replayed = request.replayed
    check_cost("replayed", replayed.tokens, replayed.cost_usd)
    async with pool.acquire() as conn:
        session = await workers.authenticate(conn, worker_id, session_token)
        awaited = await waits.await_wait(
            conn,
            session.worker_id,
            request.dispatch_id,
            request.lease_token,
            wait,
            Replayed(replayed.steps, replayed.tokens, replayed.cost_usd),
        )
    log.info(
        "await: %s",
        awaited.outcome.value,
        extra={
            "worker_id": worker_id,
            "dispatch_id": request.dispatch_id,
            "wait": wait.kind,
            "wait_name": wait.name,
            "occurrence": wait.occurrence,
        },
    )
    return checkpoints_pb2.AwaitResponse(
        outcome=_AWAITED[awaited.outcome],
        checkpoint=(
            checkpoint_message(awaited.checkpoint) if awaited.checkpoint is not None else None
        ),
    )


def _payload_json(request: durable_pb2.SendSignalRequest) -> str:
    try:
        # MessageToDict raises ValueError for a NaN or infinite number: bad input too.
        value = json_format.MessageToDict(request.payload) if request.HasField("payload") else None
        text = canonical_json(parse_value(canonical_json(value).decode(), "payload")).decode()
    except ValueError as exc:
        raise invalid("payload", str(exc)) from None
    if len(text.encode()) > MAX_SIGNAL_PAYLOAD_BYTES:
        raise invalid("payload", f"must be at most {MAX_SIGNAL_PAYLOAD_BYTES} bytes as JSON")
    return text


def _may_decide(role: str) -> None:
    """An approval that asks for admin is an admin's to decide (the role interceptor let
    only approvers and admins through)."""
    credential = caller_credential()
    if role == Role.ADMIN.value and credential is not None and Role.ADMIN not in credential.roles:
        raise errors.AwpError(
            errors.ErrorKind.PERMISSION_DENIED,
            Reason.PERMISSION_DENIED,
            f"credential {credential.name!r} may not decide this approval: it asks for the "
            "admin role",
        )


class ControlServiceWithWaits(ControlServiceWithSchedules):
    """ControlService with the signal and approval RPCs."""

    @unary
    async def SendSignal(
        self, request: durable_pb2.SendSignalRequest, context: Context
    ) -> durable_pb2.SendSignalResponse:
        run_id = parse_run_id(request.run_id)
        if not CHECKPOINT_NAME_PATTERN.fullmatch(request.name):
            raise invalid("name", f"must be {CHECKPOINT_NAME_RULE}")
        payload = _payload_json(request)
        async with self._pool.acquire() as conn:
            sent = await waits.send_signal(
                conn, run_id, request.name, payload, request.request_id or None, caller()
            )
        requests.audit(
            "SendSignal",
            run_id=str(run_id),
            signal=request.name,
            signal_id=sent.signal_id,
            delivered_to=sent.delivered_to,
            duplicate=sent.duplicate,
        )
        return durable_pb2.SendSignalResponse(
            signal_id=sent.signal_id, delivered_to=sent.delivered_to, duplicate=sent.duplicate
        )

    async def _decide(
        self, call: str, run_id_text: str, task_key: str, comment: str, approved: bool
    ) -> waits.Decided:
        run_id = parse_run_id(run_id_text)
        if not TASK_KEY_PATTERN.fullmatch(task_key):
            raise invalid("task_key", f"must be {TASK_KEY_RULE}")
        async with self._pool.acquire() as conn:
            decided = await waits.decide(
                conn, run_id, task_key, approved, caller(), comment, _may_decide
            )
        requests.audit(
            call,
            run_id=str(run_id),
            task_key=task_key,
            comment=comment,
            resumed_attempt=decided.resumed_attempt,
        )
        return decided

    @unary
    async def Approve(
        self, request: durable_pb2.ApproveRequest, context: Context
    ) -> durable_pb2.ApproveResponse:
        decided = await self._decide(
            "Approve", request.run_id, request.task_key, request.comment, True
        )
        return durable_pb2.ApproveResponse(
            task_state=TASK_STATES.proto(decided.task_state),
            resumed_attempt=decided.resumed_attempt,
            decided_at=timestamp(decided.decided_at),
        )

    @unary
    async def Reject(
        self, request: durable_pb2.RejectRequest, context: Context
    ) -> durable_pb2.RejectResponse:
        decided = await self._decide(
            "Reject", request.run_id, request.task_key, request.comment, False
        )
        return durable_pb2.RejectResponse(
            task_state=TASK_STATES.proto(decided.task_state),
            resumed_attempt=decided.resumed_attempt,
            decided_at=timestamp(decided.decided_at),
        )
