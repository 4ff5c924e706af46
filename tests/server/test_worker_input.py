"""Hostile input to WorkerService: every refusal is INVALID_ARGUMENT with an ErrorInfo
and a field, arrives whole (no RESOURCE_EXHAUSTED from an oversized error), and writes
nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2

from awp.v1 import session_pb2, worker_pb2, worker_pb2_grpc
from awp_db.connect import Pool
from awp_protocol.limits import MAX_CLAIM_WAIT_MS, MAX_REQUEST_BYTES, TRANSPORT_RECEIVE_BYTES
from awp_worker._errors import Kind, classify
from kit import WORKER_TOKEN, ServerHandle, expect_error, spec, start_run
from kit.db import dispatch_all
from kit.proto import deep_struct_bytes, length_delimited
from kit.rawworker import register

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _register(**fields: Any) -> worker_pb2.RegisterRequest:
    base: dict[str, Any] = {
        "name": "w",
        "protocol_version": 1,
        "executor_kinds": ["mock"],
        "max_concurrency": 1,
    }
    return worker_pb2.RegisterRequest(**{**base, **fields})


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_register(name="nul\x00"), "name"),
        (_register(labels={"zone": "a\x00"}), "labels['zone']"),
        (_register(executor_kinds=[f"k{i}" for i in range(10_000)]), "executor_kinds"),
        (_register(executor_kinds=["k" * 20_000]), "executor_kinds[0]"),
        (_register(labels={"k" * 20_000: "v"}), "labels['kkkk"),
        (_register(models=["llama=3"]), "models[0]"),
        (_register(resources={"gpu": 0}), "resources['gpu']"),
        (_register(resources={"g p u": 1}), "resources['g p u']"),
        (_register(models=[f"m{i}" for i in range(65)]), "models"),
    ],
    ids=[
        "nul-name",
        "nul-label",
        "10000-kinds",
        "long-kind",
        "long-label-key",
        "model-with-equals",
        "no-units",
        "bad-resource-name",
        "65-models",
    ],
)
async def test_register_refuses_bad_text_and_counts(
    stub: worker_pb2_grpc.WorkerServiceStub,
    pool: Pool,
    request_: worker_pb2.RegisterRequest,
    field: str,
) -> None:
    error = await expect_error(stub.Register(request_, metadata=AUTH))
    assert (error.code, error.reason) == (INVALID, "INVALID_ARGUMENT"), error
    assert any(found.startswith(field) for found in error.fields), error.fields
    # A short prefix of the input at most, in the message and in the field's name.
    assert len(error.message) < 2_000
    assert all(len(found) < 100 for found in error.fields), error.fields
    assert await pool.fetchval("SELECT count(*) FROM workers") == 0


@pytest.mark.parametrize(
    ("wait", "why"),
    [
        (duration_pb2.Duration(seconds=-1), "negative"),
        (duration_pb2.Duration(seconds=0, nanos=2_000_000_000), "nanos out of range"),
        (duration_pb2.Duration(seconds=1, nanos=-5), "signs disagree"),
        (duration_pb2.Duration(seconds=MAX_CLAIM_WAIT_MS // 1000 + 1), "above the maximum"),
    ],
)
async def test_claim_wait_is_validated(
    stub: worker_pb2_grpc.WorkerServiceStub, wait: duration_pb2.Duration, why: str
) -> None:
    worker = await register(stub)
    request = worker_pb2.ClaimRequest(session=worker.session, max_leases=1, wait=wait)
    error = await expect_error(stub.Claim(request))
    assert (error.code, error.fields) == (INVALID, ["wait"]), why


@pytest.fixture
async def channel(awp_server: ServerHandle) -> AsyncIterator[grpc.aio.Channel]:
    async with awp_server.channel() as opened:
        yield opened


async def test_a_struct_nested_200_deep_is_malformed_not_unknown(
    channel: grpc.aio.Channel,
) -> None:
    worker = await register(worker_pb2_grpc.WorkerServiceStub(channel))
    result = length_delimited(4, deep_struct_bytes(200))  # TaskResult.output
    request = worker_pb2.CompleteRequest(session=worker.session).SerializeToString()
    raw = channel.unary_unary("/awp.v1.WorkerService/Complete")
    error = await expect_error(raw(request + length_delimited(2, result)))
    assert (error.code, error.reason) == (INVALID, "MALFORMED_REQUEST"), error
    assert error.fields == ["results[0].output"]


async def test_a_struct_one_level_too_deep_is_refused_by_name(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    # 33 levels still decode inside a Complete, but no lease could carry them to a worker.
    worker = await register(stub)
    output = struct_pb2.Struct.FromString(deep_struct_bytes(33))
    result = worker_pb2.TaskResult(
        dispatch_id=1,
        lease_token="t",
        outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
        output=output,
    )
    error = await expect_error(
        stub.Complete(worker_pb2.CompleteRequest(session=worker.session, results=[result]))
    )
    assert (error.code, error.fields) == (INVALID, ["results[0].output"]), error
    assert "32 levels" in error.message


async def test_nul_in_an_error_message_is_refused_and_nothing_is_recorded(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    worker = await register(stub)
    await start_run(pool, spec("wf"))
    await dispatch_all(pool)
    [lease] = await worker.claim()
    failed = worker_pb2.TaskResult(
        dispatch_id=lease.dispatch_id,
        lease_token=lease.lease_token,
        outcome=worker_pb2.RESULT_OUTCOME_FAILED,
        error={"message": "boom \x00 here", "retryable": False},
    )
    error = await expect_error(
        stub.Complete(worker_pb2.CompleteRequest(session=worker.session, results=[failed]))
    )
    assert (error.code, error.fields) == (INVALID, ["results[0].error.message"]), error
    assert await pool.fetchval("SELECT state FROM attempts") == "running"


async def test_a_20000_character_token_gets_its_error_not_resource_exhausted(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    session = session_pb2.Session(worker_id="w" * 20_000, session_token="t" * 20_000)
    error = await expect_error(stub.Claim(worker_pb2.ClaimRequest(session=session, max_leases=1)))
    assert error.code == INVALID, error
    assert set(error.fields) == {"session.worker_id", "session.session_token"}


async def test_a_request_over_the_size_limit_is_too_large_naming_its_largest_field(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    worker = await register(stub)
    blob = "x" * (1024 * 1024 - 100)
    results = [
        worker_pb2.TaskResult(
            dispatch_id=i,
            lease_token="t",
            outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED,
            output={"blob": blob},
        )
        for i in range(MAX_REQUEST_BYTES // len(blob) + 1)
    ]
    request = worker_pb2.CompleteRequest(session=worker.session, results=results)
    assert request.ByteSize() > MAX_REQUEST_BYTES
    error = await expect_error(stub.Complete(request))
    assert (error.code, error.reason, error.fields) == (INVALID, "REQUEST_TOO_LARGE", ["results"])


async def test_one_result_of_the_largest_output_always_fits(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    # The costliest 1 MiB of JSON in protobuf: a list of zeros, 2 bytes each as JSON and
    # 11 as protobuf. Alone in a Complete it must reach the handler (here: LEASE_LOST).
    output = struct_pb2.Struct()
    output.get_or_create_list("zeros").extend([0] * (512 * 1024 - 8))
    result = worker_pb2.TaskResult(
        dispatch_id=1, lease_token="t", outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED, output=output
    )
    assert result.ByteSize() > 5 * 1024 * 1024
    worker = await register(stub)
    answer = await stub.Complete(
        worker_pb2.CompleteRequest(session=worker.session, results=[result])
    )
    assert [a.outcome for a in answer.answers] == [session_pb2.COMPLETE_OUTCOME_LEASE_LOST]


async def test_beyond_the_transport_limit_a_worker_gives_the_request_up(
    stub: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    # Past TRANSPORT_RECEIVE_BYTES gRPC itself refuses, RESOURCE_EXHAUSTED without details:
    # a worker must not resend that request forever as if the server were overloaded.
    worker = await register(stub)
    result = worker_pb2.TaskResult(
        dispatch_id=1,
        lease_token="t",
        outcome=worker_pb2.RESULT_OUTCOME_FAILED,
        error={"message": "x" * (TRANSPORT_RECEIVE_BYTES + 1)},
    )
    try:
        await stub.Complete(worker_pb2.CompleteRequest(session=worker.session, results=[result]))
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert classify(error) is Kind.REJECTED
    else:
        raise AssertionError("gRPC accepted a request over its receive limit")
