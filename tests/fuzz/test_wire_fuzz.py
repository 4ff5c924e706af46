"""A wire-level fuzzer: for every RPC of WorkerService and ControlService, generated and
mutated protobuf bytes go over a real channel to a real awp-server on a real database.

Every answer must be OK or a defined status carrying an ErrorInfo, never UNKNOWN or
INTERNAL; a refused call writes nothing (row counts unchanged); the server stays SERVING.
Bounded: AWP_FUZZ_EXAMPLES cases per RPC (default 200: a few thousand in all), run in
rounds of ROUND cases, no new round once FUZZ_BUDGET_S seconds have passed for the RPC.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Final

import grpc
import pytest
from fuzz_figures import CASES_RUN, report
from fuzz_strategies import messages, mutate, nested
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awp.v1 import (
    checkpoints_pb2,
    control_pb2,
    control_pb2_grpc,
    durable_pb2,
    runs_pb2,
    session_pb2,
    streams_pb2,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from awp_db.connect import Pool
from awp_protocol.errors import decode_details
from awp_protocol.limits import TRANSPORT_RECEIVE_BYTES
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerFactory
from kit.proto import deep_struct_bytes, length_delimited, struct

EXAMPLES: Final = int(os.environ.get("AWP_FUZZ_EXAMPLES", "200"))
FUZZ_BUDGET_S: Final = float(os.environ.get("AWP_FUZZ_BUDGET_S", "15"))
ROUND: Final = 25
# A call that hangs is a failure in itself: it is cut off (DEADLINE_EXCEEDED) and reported.
CALL_TIMEOUT_S: Final = 10.0
UNDEFINED: Final = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
TABLES: Final = ("workers", "workflows", "runs", "tasks", "state_events", "dispatches", "attempts")

METHODS: Final = [
    method
    for file, service in (
        (worker_pb2.DESCRIPTOR, "WorkerService"),
        (control_pb2.DESCRIPTOR, "ControlService"),
    )
    for method in file.services_by_name[service].methods
]


def _struct_paths(message_type: descriptor.Descriptor, depth: int = 0) -> list[list[int]]:
    """Field-number paths from a request to each Struct it holds (where deep JSON goes)."""
    found: list[list[int]] = []
    for field in message_type.fields:
        inner = field.message_type
        if inner is None or inner.GetOptions().map_entry:
            continue
        if inner.full_name == "google.protobuf.Struct":
            found.append([field.number])
        elif inner.full_name.startswith("awp.v1.") and depth < 3:
            found.extend([field.number, *path] for path in _struct_paths(inner, depth + 1))
    return found


def _wrap(path: list[int], payload: bytes) -> bytes:
    for number in reversed(path):
        payload = length_delimited(number, payload)
    return payload


class Target:
    """One RPC over a plain (blocking) channel: raw bytes in, its status out."""

    def __init__(self, channel: grpc.Channel, method: descriptor.MethodDescriptor) -> None:
        path = f"/{method.containing_service.full_name}/{method.name}"
        token = WORKER_TOKEN if method.name == "Register" else ADMIN_TOKEN
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.method = method
        if method.client_streaming:
            self._call: Callable[[Any], Any] = channel.stream_stream(path)
        elif method.server_streaming:
            self._call = channel.unary_stream(path)
        else:
            self._call = channel.unary_unary(path)

    def send(self, messages: list[bytes]) -> tuple[grpc.StatusCode, str]:
        """The call's code and its ErrorInfo reason ("" when it carries none)."""
        request: Any = iter(messages) if self.method.client_streaming else messages[0]
        try:
            answer = self._call(request, timeout=CALL_TIMEOUT_S, metadata=self.metadata)
            if self.method.server_streaming:
                for _ in answer:
                    pass
        except grpc.RpcError as exc:
            error: Any = exc
            return error.code(), decode_details(error.trailing_metadata()).reason
        return grpc.StatusCode.OK, ""


async def _world(address: str) -> dict[str, Any]:
    """A real session, workflow and run, so that generated requests get past lookups."""
    async with grpc.aio.insecure_channel(address) as channel:
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        registered = await worker.Register(
            worker_pb2.RegisterRequest(
                name="fuzz", protocol_version=1, executor_kinds=["mock"], max_concurrency=4
            ),
            metadata=(("authorization", f"Bearer {WORKER_TOKEN}"),),
        )
        control = control_pb2_grpc.ControlServiceStub(channel)
        admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
        definition = control_pb2.CreateWorkflowRequest()
        definition.definition.name, definition.definition.version = "wf", 1
        definition.definition.tasks.add(key="a", executor_kind="mock", action="noop")
        await control.CreateWorkflow(definition, metadata=admin)
        run = await control.StartRun(
            runs_pb2.StartRunRequest(workflow_name="wf", input=struct({"n": 1})),
            metadata=admin,
        )
    return {"session": registered.session, "run_id": run.run.id}


def _valid(method: str, world: dict[str, Any]) -> Message:
    """A request of `method` its handler accepts: "tweaked" cases change one field of it,
    so that they reach past the first check."""
    session = world["session"]
    requests: dict[str, Message] = {
        "Register": worker_pb2.RegisterRequest(
            name="fuzz", protocol_version=1, executor_kinds=["mock"], max_concurrency=1
        ),
        "Claim": worker_pb2.ClaimRequest(session=session, max_leases=1),
        "Heartbeat": worker_pb2.HeartbeatRequest(session=session),
        "Complete": worker_pb2.CompleteRequest(
            session=session,
            results=[
                worker_pb2.TaskResult(
                    dispatch_id=1, lease_token="t", outcome=worker_pb2.RESULT_OUTCOME_SUCCEEDED
                )
            ],
        ),
        "Drain": worker_pb2.DrainRequest(session=session),
        "GetUpstreamOutputs": worker_pb2.GetUpstreamOutputsRequest(
            session=session, dispatch_id=1, lease_token="t", keys=["a"]
        ),
        "AppendStream": streams_pb2.AppendStreamRequest(
            session=session,
            dispatch_id=1,
            lease_token="t",
            chunks=[streams_pb2.StreamChunkIn(text="fuzz")],
        ),
        "LoadCheckpoints": checkpoints_pb2.LoadCheckpointsRequest(
            session=session, dispatch_id=1, lease_token="t"
        ),
        "RecordStep": checkpoints_pb2.RecordStepRequest(
            session=session, dispatch_id=1, lease_token="t", name="step", value_json="{}"
        ),
        "Await": checkpoints_pb2.AwaitRequest(
            session=session,
            dispatch_id=1,
            lease_token="t",
            kind=types_pb2.CHECKPOINT_KIND_SIGNAL,
            name="go",
        ),
        "SendSignal": durable_pb2.SendSignalRequest(run_id=world["run_id"], name="go"),
        "Approve": durable_pb2.ApproveRequest(run_id=world["run_id"], task_key="a"),
        "Reject": durable_pb2.RejectRequest(run_id=world["run_id"], task_key="a"),
        "CreateWorkflow": control_pb2.CreateWorkflowRequest(
            definition=types_pb2.WorkflowDefinition(
                name="wf2",
                version=1,
                tasks=[types_pb2.TaskDefinition(key="a", executor_kind="mock", action="noop")],
            )
        ),
        "GetWorkflow": control_pb2.GetWorkflowRequest(name="wf"),
        "StartRun": runs_pb2.StartRunRequest(workflow_name="wf"),
        "GetRun": runs_pb2.GetRunRequest(run_id=world["run_id"]),
        "GetTaskOutput": runs_pb2.GetTaskOutputRequest(run_id=world["run_id"], task_key="a"),
        "CancelRun": runs_pb2.CancelRunRequest(run_id=world["run_id"], reason="fuzz"),
        # Not the live run: its watch would never end.
        "WatchRun": runs_pb2.WatchRunRequest(run_id=str(uuid.uuid4())),
    }
    found = requests.get(method)
    if found is not None:
        return found
    return message_factory.GetMessageClass(
        control_pb2.DESCRIPTOR.services_by_name["ControlService"].methods_by_name[method].input_type
    )()


async def _row_counts(pool: Pool) -> tuple[int, ...]:
    query = "SELECT " + ", ".join(f"(SELECT count(*) FROM {table})" for table in TABLES)
    row = await pool.fetchrow(query)
    assert row is not None
    return tuple(row)


async def _serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def _campaign(
    target: Target, world: dict[str, Any], counts: Callable[[], tuple[int, ...]]
) -> Counter[str]:
    """Runs the hypothesis campaign for one RPC (in a thread: it blocks on each call)."""
    request_type = target.method.input_type
    known = ["wf", "mock", "python", "noop", world["session"].worker_id]
    if target.method.name != "WatchRun":  # a watch of a live run never ends by itself
        known.append(world["run_id"])
    generic_session = messages(session_pb2.Session.DESCRIPTOR, known, {})
    overrides = {"awp.v1.Session": st.just(world["session"]) | generic_session}
    requests = messages(request_type, known, overrides)
    struct_paths = _struct_paths(request_type)
    valid = _valid(target.method.name, world)
    kinds = ["generated", "mutated", "random"]
    kinds += ["tweaked"] if request_type.fields else []
    kinds += ["deep"] if struct_paths else []
    answers: Counter[str] = Counter()

    def one(data: st.DataObject) -> bytes:
        kind = data.draw(st.sampled_from(kinds))
        if kind == "random":
            return data.draw(st.binary(max_size=96))
        generated = data.draw(requests)
        if kind == "tweaked":
            # The valid request with one field replaced by the generated one's.
            name = data.draw(st.sampled_from([field.name for field in request_type.fields]))
            base, only = type(valid)(), type(generated)()
            base.CopyFrom(valid)
            base.ClearField(name)
            only.CopyFrom(generated)
            for field in request_type.fields:
                if field.name != name:
                    only.ClearField(field.name)
            return base.SerializeToString() + only.SerializeToString()
        raw = generated.SerializeToString()
        if kind == "mutated":
            return mutate(raw, data)
        if kind == "deep":
            # Concatenated messages merge: the request gains a Struct nested past the limit.
            depth = data.draw(st.sampled_from([33, 34, 40, 60, 200, 1000]))
            return raw + _wrap(data.draw(st.sampled_from(struct_paths)), deep_struct_bytes(depth))
        return raw

    @settings(
        max_examples=min(ROUND, EXAMPLES),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def case(data: st.DataObject) -> None:
        stream = [one(data)]
        if target.method.client_streaming:
            stream += [one(data) for _ in range(data.draw(st.integers(0, 2)))]
        before = counts()
        code, reason = target.send(stream)
        answers[code.name] += 1
        shown = [chunk[:64].hex() for chunk in stream]
        assert code not in UNDEFINED, f"{target.method.name} answered {code.name}: {shown}"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
            len(chunk) > TRANSPORT_RECEIVE_BYTES for chunk in stream
        ):
            return  # the transport's own refusal, before any handler (limits.py says so)
        if code != grpc.StatusCode.OK:
            assert reason, f"{target.method.name} answered {code.name} without ErrorInfo: {shown}"
            assert counts() == before, f"a refused {target.method.name} wrote rows: {shown}"

    stop_at = time.monotonic() + FUZZ_BUDGET_S
    # Each round is a whole hypothesis run (fresh random cases, shrinking on failure).
    while sum(answers.values()) < EXAMPLES and time.monotonic() < stop_at:
        case()
    return answers


def _names(methods: list[descriptor.MethodDescriptor]) -> Iterator[str]:
    for method in methods:
        yield f"{method.containing_service.name}.{method.name}"


@pytest.mark.parametrize("method", METHODS, ids=list(_names(METHODS)))
async def test_every_answer_is_defined(
    method: descriptor.MethodDescriptor, start_server: ServerFactory, pool: Pool
) -> None:
    # Short long polls: a Claim with the real session parks at most this long.
    server = await start_server(claim_max_wait_s=0.05)
    world = await _world(server.address)
    loop = asyncio.get_running_loop()

    def counts() -> tuple[int, ...]:
        return asyncio.run_coroutine_threadsafe(_row_counts(pool), loop).result(10)

    with grpc.insecure_channel(server.address) as channel:
        answers = await asyncio.to_thread(_campaign, Target(channel, method), world, counts)
    total = sum(answers.values())
    CASES_RUN.append(total)
    spread = ", ".join(f"{name} {count}" for name, count in answers.most_common())
    report(f"fuzz: {method.containing_service.name}/{method.name}: {total} cases ({spread})")
    assert total >= min(EXAMPLES, 50), "the time budget cut the campaign short"
    assert await _serving(server.address), "the server stopped SERVING"


def test_the_deep_struct_bytes_are_what_protobuf_would_write() -> None:
    # The hand encoding must be the real one, or the deep cases test nothing.
    assert deep_struct_bytes(5) == nested(5).SerializeToString()
