"""WorkerService's step checkpoint RPCs, LoadCheckpoints and RecordStep (worker.proto,
their messages checkpoints.proto; docs/design.md §16): the wire conversions and the
memo's own checks; the fencing and the storage are awp_db.checkpoints'.
"""

from __future__ import annotations

import logging
from typing import Final

from awp.v1 import checkpoints_pb2, types_pb2
from awp_db import checkpoints, workers
from awp_db.connect import Pool
from awp_kernel.errors import invalid
from awp_kernel.fencing import ResultVerdict
from awp_protocol.jsonvalue import JsonInvalid, canonical_json, parse_value
from awp_protocol.limits import MAX_CHECKPOINT_PAGE_BYTES, MAX_MEMO_BYTES
from awp_protocol.names import CHECKPOINT_NAME_PATTERN, CHECKPOINT_NAME_RULE
from awp_protocol.results import check_cost
from awp_server import control_requests, convert, metrics

CHECKPOINT_KINDS_MAP: Final = convert.CHECKPOINT_KINDS
_PAGE_TOKEN: Final = "checkpoints"

log = logging.getLogger("awp.server.checkpoints")


def checkpoint_message(stored: checkpoints.StoredCheckpoint) -> checkpoints_pb2.Checkpoint:
    return checkpoints_pb2.Checkpoint(
        kind=CHECKPOINT_KINDS_MAP.proto(stored.kind),
        name=stored.name,
        occurrence=stored.occurrence,
        value_json=stored.value_json,
        usage=types_pb2.StepUsage(tokens=stored.tokens, cost_usd=stored.cost_usd),
        timed_out=stored.timed_out,
        attempt=stored.attempt,
    )


async def load_checkpoints(
    pool: Pool, worker_id: str, session_token: str, request: checkpoints_pb2.LoadCheckpointsRequest
) -> checkpoints_pb2.LoadCheckpointsResponse:
    after: tuple[str, str, int] | None = None
    if request.page_token:
        kind, name, occurrence = control_requests.decode_token(
            request.page_token, _PAGE_TOKEN, (str, str, int)
        )
        after = (kind, name, occurrence)
    async with pool.acquire() as conn:
        session = await workers.authenticate(conn, worker_id, session_token)
        page = await checkpoints.load_page(
            conn,
            session.worker_id,
            request.dispatch_id,
            request.lease_token,
            after,
            MAX_CHECKPOINT_PAGE_BYTES,
        )
    following = checkpoints.next_page(page)
    return checkpoints_pb2.LoadCheckpointsResponse(
        checkpoints=[checkpoint_message(stored) for stored in page],
        next_page_token=(
            control_requests.encode_token(_PAGE_TOKEN, list(following)) if following else ""
        ),
    )


def step_memo(request: checkpoints_pb2.RecordStepRequest) -> checkpoints.StepMemo:
    """The memo of a RecordStep, or INVALID_ARGUMENT naming the field (MEMO_LIMIT past
    the size of a memo)."""
    if not CHECKPOINT_NAME_PATTERN.fullmatch(request.name):
        raise invalid("name", f"must be {CHECKPOINT_NAME_RULE}")
    try:
        value_json = canonical_json(parse_value(request.value_json, "value_json")).decode()
    except JsonInvalid as exc:
        raise invalid("value_json", str(exc)) from None
    size = len(value_json.encode())
    if size > MAX_MEMO_BYTES:
        raise checkpoints.memo_limit(
            f"step {request.name!r}: its memo is {size} bytes of JSON, more than the "
            f"{MAX_MEMO_BYTES} one memo may hold (the memo size limit)"
        )
    usage = request.usage
    check_cost("usage", usage.tokens, usage.cost_usd)
    return checkpoints.StepMemo(
        name=request.name,
        occurrence=request.occurrence,
        value_json=value_json,
        value_bytes=size,
        tokens=usage.tokens,
        cost_usd=usage.cost_usd,
    )


async def record_step(
    pool: Pool, worker_id: str, session_token: str, request: checkpoints_pb2.RecordStepRequest
) -> ResultVerdict:
    memo = step_memo(request)
    async with pool.acquire() as conn:
        session = await workers.authenticate(conn, worker_id, session_token)
        verdict = await checkpoints.record_step(
            conn, session.worker_id, request.dispatch_id, request.lease_token, memo
        )
    metrics.MEMO_WRITES.labels(verdict.value).inc()
    if verdict is ResultVerdict.LEASE_LOST:
        log.info(
            "step memo refused: lease lost",
            extra={
                "worker_id": worker_id,
                "dispatch_id": request.dispatch_id,
                "step": request.name,
                "occurrence": request.occurrence,
            },
        )
    return verdict
