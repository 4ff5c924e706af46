"""The checks and encodings ControlService's handlers share (and the schedule RPCs with
them): names, versions, JSON inputs, a delayed start, page sizes, keyset page tokens, and
the audit trail's line. The request guard (awp_server.guard) has already checked every
text's length, NUL characters and durations before any of these runs."""

from __future__ import annotations

import base64
import binascii
import json
import logging
from dataclasses import replace
from typing import Any

import grpc
from google.protobuf import struct_pb2

from awp.v1 import runs_pb2
from awp_common.tracing import TRACEPARENT, RunTrace
from awp_db import runs
from awp_kernel.errors import AwpError, ErrorKind, invalid
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import JsonInvalid, canonical_json, json_size, struct_to_dict
from awp_protocol.limits import (
    MAX_INPUT_BYTES,
    MAX_PRIORITY,
    MAX_SEQ,
    MAX_START_DELAY_MS,
    MAX_VERSION,
    MIN_PRIORITY,
)
from awp_protocol.names import NAME_PATTERN, NAME_RULE
from awp_server import convert
from awp_server.auth import caller

# One logger for the audit trail, so that it can be routed on its own.
audit_log = logging.getLogger("awp.audit")


def differs(
    request: runs_pb2.StartRunRequest, run_input: dict[str, Any], run: runs_pb2.Run
) -> str | None:
    """What of a StartRun differs from the run its request_id already started, if any.

    Version 0 ("the latest") matches any version: a retry must still find its run after
    a newer version was created. Inputs are compared as canonical JSON, both read
    through the same Struct conversion, so key order and 1 vs 1.0 do not count.
    """
    if run.workflow_name != request.workflow_name or request.workflow_version not in (
        0,
        run.workflow_version,
    ):
        return "workflow"
    if canonical_json(struct_to_dict(run.input)) != canonical_json(run_input):
        return "input"
    if run.priority != request.priority:
        return "priority"
    if run.retried_from_run_id:
        return f"request (a RetryRun of run {run.retried_from_run_id})"
    return None


# ---------------------------------------------------------------- input checks


def same_request(
    request: runs_pb2.StartRunRequest, run_input: dict[str, Any], run: runs_pb2.Run
) -> None:
    """A StartRun whose request_id started `run` before must be that request again: the
    same key with another request is not a retry, and returning the other run would hide
    the client's bug (ALREADY_EXISTS / REQUEST_ID_CONFLICT)."""
    found = differs(request, run_input, run)
    if found is not None:
        raise AwpError(
            ErrorKind.ALREADY_EXISTS,
            Reason.REQUEST_ID_CONFLICT,
            f"request_id {request.request_id!r} already started run {run.id} of "
            f"{run.workflow_name}@{run.workflow_version} with another {found}",
            metadata={"run_id": run.id},
        )


def audit(call: str, **fields: object) -> None:
    """The audit trail's log line of a ControlService write: who, what, on what."""
    audit_log.info("audit", extra={"call": call, "by": caller(), **fields})


def check_name(field: str, name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise invalid(field, f"must be {NAME_RULE}")


def run_start(
    request: runs_pb2.StartRunRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> tuple[dict[str, Any], runs.Start]:
    """A StartRun request's input and start, checked (StartRun, and each StartRuns entry)."""
    check_name("workflow_name", request.workflow_name)
    check_version("workflow_version", request.workflow_version)
    run_input = json_object("input", request.input)
    start = replace(
        delayed_start(request), trace=run_trace(context), priority=run_priority(request)
    )
    return run_input, start


def delayed_start(request: runs_pb2.StartRunRequest) -> runs.Start:
    """StartRun's start_time or start_delay (at most one; the guard checked the
    Duration's range)."""
    if request.HasField("start_time") and request.HasField("start_delay"):
        raise invalid("start_delay", "give at most one of start_time and start_delay")
    if request.HasField("start_time"):
        return runs.Start(at=convert.instant("start_time", request.start_time))
    if request.HasField("start_delay"):
        delay_ms = request.start_delay.ToMilliseconds()
        if not 0 <= delay_ms <= MAX_START_DELAY_MS:
            raise invalid("start_delay", f"must be between 0 and {MAX_START_DELAY_MS} ms")
        return runs.Start(delay_ms=delay_ms)
    return runs.Start()


def run_priority(request: runs_pb2.StartRunRequest) -> int:
    if not MIN_PRIORITY <= request.priority <= MAX_PRIORITY:
        raise invalid("priority", f"must be {MIN_PRIORITY} to {MAX_PRIORITY}")
    return request.priority


def run_trace(context: grpc.aio.ServicerContext[Any, Any]) -> RunTrace | None:
    """A new run's trace: the caller's (its W3C traceparent metadata), or a new one when
    this server traces (RunTrace.of_caller)."""
    traceparent = None
    for key, value in context.invocation_metadata() or ():
        if key == TRACEPARENT and isinstance(value, str):
            traceparent = value
    return RunTrace.of_caller(traceparent)


def check_version(field: str, version: int) -> None:
    # 0 means "the latest"; the column is a PostgreSQL integer.
    if version > MAX_VERSION:
        raise invalid(field, f"must be 0 (latest) to {MAX_VERSION}")


def json_object(field: str, value: struct_pb2.Struct) -> dict[str, Any]:
    try:
        data = struct_to_dict(value)
    except JsonInvalid as exc:
        raise invalid(field, str(exc)) from None
    size = json_size(data)
    if size > MAX_INPUT_BYTES:
        raise invalid(field, f"is {size} bytes serialised; at most {MAX_INPUT_BYTES}")
    return data


def page_size(requested: int, default: int, maximum: int) -> int:
    # Capped, not refused: a client asking for more simply gets pages of the maximum.
    return min(requested or default, maximum)


# ---------------------------------------------------------------- page tokens
# Opaque to clients: URL-safe base64 of JSON [kind, *last key of the previous page]. The
# kind stops a token of one listing from being replayed against another.


def encode_token(kind: str, key: list[Any]) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, kind: str, shape: tuple[type, ...]) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad_token() from None
    if (
        not isinstance(decoded, list)
        or len(decoded) != len(shape) + 1
        or decoded[0] != kind
        # bool is an int to isinstance, and never a valid key part.
        or not all(
            isinstance(part, expected) and not isinstance(part, bool)
            for part, expected in zip(decoded[1:], shape, strict=True)
        )
    ):
        raise bad_token()
    return decoded[1:]


def after_id(token: str, kind: str) -> int:
    """The row id a keyset page token of this kind resumes after; 0 for the first page."""
    if not token:
        return 0
    (after,) = decode_token(token, kind, (int,))
    if not 0 < after <= MAX_SEQ:  # a row id, a PostgreSQL bigint
        raise bad_token()
    return int(after)


def bad_token() -> AwpError:
    return invalid("page_token", "is not a page token this listing issued")
