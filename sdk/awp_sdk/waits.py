"""The requests that resume waiting tasks (docs/design.md §16): a signal to a run, a
decision on an approval. AsyncClient's send_signal, approve and reject send them."""

from __future__ import annotations

from typing import Any

from awp.v1 import durable_pb2
from awp_protocol.jsonvalue import JsonInvalid, to_value
from awp_sdk.errors import json_refused


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
