"""The worker refuses at start-up exactly the settings the server's Register refuses."""

from __future__ import annotations

import asyncio
import string
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_worker_cli import spawn

from awp.v1 import worker_pb2, worker_pb2_grpc
from awp_protocol.limits import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_WORKER_CONCURRENCY,
    MAX_WORKER_NAME_CHARS,
    PROTOCOL_VERSION,
)
from awp_worker._config import WorkerConfig
from kit import WORKER_TOKEN, ServerHandle

AUTH = (("authorization", f"Bearer {WORKER_TOKEN}"),)
# Each example is one real Register: a bounded number keeps the test quick.
AGAINST_THE_SERVER = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
KIND_CHARS = string.ascii_lowercase + string.digits + "_-A."


@pytest.fixture
async def stub(awp_server: ServerHandle) -> AsyncIterator[worker_pb2_grpc.WorkerServiceStub]:
    async with awp_server.channel() as channel:
        yield worker_pb2_grpc.WorkerServiceStub(channel)


def worker_refuses(
    name: str, kinds: Sequence[str], concurrency: int, labels: Mapping[str, str]
) -> bool:
    try:
        WorkerConfig(name=name, kinds=tuple(kinds), concurrency=concurrency, labels=labels)
    except ValueError:
        return True
    return False


async def server_refuses(
    stub: worker_pb2_grpc.WorkerServiceStub,
    name: str,
    kinds: Sequence[str],
    concurrency: int,
    labels: Mapping[str, str],
) -> bool:
    request = worker_pb2.RegisterRequest(
        name=name,
        protocol_version=PROTOCOL_VERSION,
        executor_kinds=kinds,
        max_concurrency=concurrency,
        labels=labels,
    )
    try:
        await stub.Register(request, metadata=AUTH)
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        return True
    return False


async def agree(
    stub: worker_pb2_grpc.WorkerServiceStub,
    name: str = "w",
    kinds: Sequence[str] = ("mock",),
    concurrency: int = 1,
    labels: Mapping[str, str] | None = None,
) -> None:
    settings_ = (name, kinds, concurrency, labels or {})
    assert worker_refuses(*settings_) == await server_refuses(stub, *settings_), settings_


@AGAINST_THE_SERVER
@given(name=st.text(string.ascii_letters, max_size=MAX_WORKER_NAME_CHARS + 8))
async def test_the_name_length(stub: worker_pb2_grpc.WorkerServiceStub, name: str) -> None:
    await agree(stub, name=name)


@AGAINST_THE_SERVER
@given(kinds=st.lists(st.text(KIND_CHARS, max_size=40), max_size=3))
async def test_executor_kinds(stub: worker_pb2_grpc.WorkerServiceStub, kinds: list[str]) -> None:
    await agree(stub, kinds=kinds)


@AGAINST_THE_SERVER
@given(concurrency=st.integers(0, MAX_WORKER_CONCURRENCY + 2))  # uint32 on the wire
async def test_max_concurrency(stub: worker_pb2_grpc.WorkerServiceStub, concurrency: int) -> None:
    await agree(stub, concurrency=concurrency)


@AGAINST_THE_SERVER
@given(
    labels=st.dictionaries(
        st.text(string.ascii_letters + "./- ", min_size=1, max_size=66),
        st.text(string.ascii_letters, max_size=MAX_LABEL_VALUE_CHARS + 4),
        max_size=3,
    )
)
async def test_labels(stub: worker_pb2_grpc.WorkerServiceStub, labels: dict[str, str]) -> None:
    await agree(stub, labels=labels)


@pytest.mark.parametrize("count", [MAX_LABELS, MAX_LABELS + 1])
async def test_the_label_count(stub: worker_pb2_grpc.WorkerServiceStub, count: int) -> None:
    await agree(stub, labels={f"k{i}": "v" for i in range(count)})


async def test_a_kind_the_server_would_refuse_stops_the_worker_at_start_up(
    tmp_path: Path,
) -> None:
    kind = "k" * 40  # a worker once accepted up to 64 characters; the server 32
    # Nothing listens on port 9: the worker must fail before it tries to connect.
    process = await spawn(tmp_path, "--server", "127.0.0.1:9", "--kinds", f"mock,{kind}")
    async with asyncio.timeout(20):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    text = stderr.decode()
    assert f"--kinds: '{kind}' is not an executor kind name" in text
    assert "1-32 characters" in text
