"""Every RPC of both services through server reflection alone, as grpcurl makes them,
and reflection itself in both of its versions.

No generated stub or message class is used on the client side: the descriptors come from
the server (ProtoReflectionDescriptorDatabase), the message classes are built from them,
requests are parsed from the same JSON bodies docs/grpcurl.md shows, and responses are
read back as JSON. The sync reflection client runs in a thread, since the in-process
server lives on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from awp_db import dispatching
from awp_db.connect import Pool
from awp_protocol.errors import decode_details
from kit import ADMIN_TOKEN, WORKER_TOKEN, ServerHandle

CONTROL = "awp.v1.ControlService"
WORKER = "awp.v1.WorkerService"
JSON = dict[str, Any]


@dataclass
class ReflectedMethod:
    path: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool


class ReflectionClient:
    """What grpcurl does: resolve a method by name over reflection, call it with JSON."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.database = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.database)

    def services(self) -> list[str]:
        return list(self.database.get_services())

    def method(self, service: str, name: str) -> ReflectedMethod:
        found = self.pool.FindServiceByName(service).methods_by_name[name]
        return ReflectedMethod(
            f"/{service}/{name}",
            message_factory.GetMessageClass(found.input_type),
            message_factory.GetMessageClass(found.output_type),
            found.client_streaming,
            found.server_streaming,
        )

    @staticmethod
    def _auth(token: str) -> tuple[tuple[str, str | bytes], ...]:
        return (("authorization", f"Bearer {token}"),)

    @staticmethod
    def _parse(method: ReflectedMethod, body: JSON) -> Message:
        return json_format.Parse(json.dumps(body), method.request())

    @staticmethod
    def _json(message: Message) -> JSON:
        return json_format.MessageToDict(message)

    def unary(self, service: str, name: str, body: JSON, token: str = ADMIN_TOKEN) -> JSON:
        method = self.method(service, name)
        assert not method.client_streaming and not method.server_streaming
        call = self.channel.unary_unary(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        return self._json(call(self._parse(method, body), metadata=self._auth(token), timeout=10))

    def server_stream(self, service: str, name: str, body: JSON) -> list[JSON]:
        method = self.method(service, name)
        assert method.server_streaming and not method.client_streaming
        call = self.channel.unary_stream(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        answers = call(self._parse(method, body), metadata=self._auth(ADMIN_TOKEN), timeout=10)
        return [self._json(answer) for answer in answers]

    def bidi_first_answer(
        self, service: str, name: str, body: JSON, while_open: Any = None
    ) -> JSON:
        """Sends one message on a bidi stream, reads the first answer, runs `while_open`
        with the stream still open (a heartbeat stream closed early shortens leases),
        then closes it."""
        method = self.method(service, name)
        assert method.server_streaming and method.client_streaming
        call = self.channel.stream_stream(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        done = threading.Event()

        def requests() -> Iterator[Message]:
            yield self._parse(method, body)
            done.wait(10)

        answers = call(requests(), timeout=10)
        try:
            first = self._json(next(answers))
            if while_open is not None:
                while_open()
            return first
        finally:
            done.set()
            answers.cancel()


def definition() -> JSON:
    return {
        "name": "reflected",
        "version": 1,
        "description": "made over reflection",
        "tasks": [
            {
                "key": "fetch",
                "executorKind": "mock",
                "action": "sources.fetch",
                "input": {"source": "news"},
                "retry": {"maxAttempts": 2, "initialBackoff": "0.250s"},
                "timeout": "30s",
            },
            {
                "key": "publish",
                "executorKind": "mock",
                "action": "digest.publish",
                "dependsOn": ["fetch"],
            },
        ],
    }


async def dispatch(pool: Pool) -> int:
    # The coordinator's job; this test runs only the server.
    async with pool.acquire() as conn:
        return (await dispatching.create_dispatches(conn)).created


async def test_every_rpc_through_reflection(awp_server: ServerHandle, pool: Pool) -> None:
    channel = grpc.insecure_channel(awp_server.address)
    client = ReflectionClient(channel)
    call = asyncio.to_thread
    try:
        services = await call(client.services)
        assert {CONTROL, WORKER, "grpc.health.v1.Health"} <= set(services)

        created = await call(client.unary, CONTROL, "CreateWorkflow", {"definition": definition()})
        assert created["created"] is True
        assert created["workflow"]["definition"]["tasks"][1]["dependsOn"] == ["fetch"]
        got = await call(client.unary, CONTROL, "GetWorkflow", {"name": "reflected"})
        assert got["workflow"]["definition"]["version"] == 1
        listed = await call(client.unary, CONTROL, "ListWorkflows", {"pageSize": 10})
        assert [w["definition"]["name"] for w in listed["workflows"]] == ["reflected"]

        registered = await call(
            client.unary,
            WORKER,
            "Register",
            {
                "name": "reflector",
                "protocolVersion": 1,
                "executorKinds": ["mock"],
                "maxConcurrency": 2,
                "labels": {"via": "reflection"},
            },
            WORKER_TOKEN,
        )
        session = registered["session"]
        assert registered["heartbeatInterval"].endswith("s")

        started = await call(
            client.unary,
            CONTROL,
            "StartRun",
            {"workflowName": "reflected", "input": {"topic": "x"}, "requestId": "req-1"},
        )
        run_id = started["run"]["id"]
        assert started["created"] is True
        again = await call(
            client.unary,
            CONTROL,
            "StartRun",
            {"workflowName": "reflected", "input": {"topic": "x"}, "requestId": "req-1"},
        )
        assert again["run"]["id"] == run_id and "created" not in again  # false: not emitted
        run = await call(client.unary, CONTROL, "GetRun", {"runId": run_id})
        assert {t["key"]: t["state"] for t in run["tasks"]} == {
            "fetch": "TASK_STATE_READY",
            "publish": "TASK_STATE_PENDING",
        }
        running = {"workflowName": "reflected", "state": "RUN_STATE_RUNNING"}
        runs = await call(client.unary, CONTROL, "ListRuns", running)
        assert [r["id"] for r in runs["runs"]] == [run_id]

        for task in ("fetch", "publish"):
            assert await dispatch(pool) == 1
            claimed = await call(
                client.unary, WORKER, "Claim", {"session": session, "maxLeases": 2, "wait": "5s"}
            )
            [lease] = claimed["leases"]
            assert lease["taskKey"] == task and lease["idempotencyKey"] == f"{run_id}/{task}"
            appended = await call(
                client.unary,
                WORKER,
                "AppendStream",
                {
                    "session": session,
                    "dispatchId": lease["dispatchId"],
                    "leaseToken": lease["leaseToken"],
                    "chunks": [{"text": f"{task} says hi"}, {"json": '{"n": 1}'}],
                },
            )
            assert appended == {"outcome": "COMPLETE_OUTCOME_ACCEPTED", "nextOffset": "2"}
            result = {
                "session": session,
                "results": [
                    {
                        "dispatchId": lease["dispatchId"],
                        "leaseToken": lease["leaseToken"],
                        "outcome": "RESULT_OUTCOME_SUCCEEDED",
                        "output": {"task": task},
                    }
                ],
            }
            completed: list[JSON] = []

            def complete(body: JSON = result, into: list[JSON] = completed) -> None:
                into.append(client.unary(WORKER, "Complete", body))

            heartbeat = await call(
                client.bidi_first_answer,
                WORKER,
                "Heartbeat",
                {
                    "session": session,
                    "leases": [
                        {"dispatchId": lease["dispatchId"], "leaseToken": lease["leaseToken"]}
                    ],
                },
                complete,
            )
            assert heartbeat["sessionState"] == "WORKER_STATE_ACTIVE"
            assert heartbeat["leases"][0]["status"] == "LEASE_STATUS_RENEWED"
            assert completed[0]["answers"][0]["outcome"] == "COMPLETE_OUTCOME_ACCEPTED"

        watched = await call(client.server_stream, CONTROL, "WatchRun", {"runId": run_id})
        events = [answer["event"] for answer in watched]
        seqs = [int(e["seq"]) for e in events]  # uint64 is a JSON string
        assert seqs == list(range(1, len(seqs) + 1))
        assert (events[-1]["type"], events[-1]["runTransition"]) == (
            "EVENT_TYPE_RUN_STATE",
            {"fromState": "RUN_STATE_RUNNING", "toState": "RUN_STATE_SUCCEEDED"},
        )
        resumed = await call(
            client.server_stream, CONTROL, "WatchRun", {"runId": run_id, "afterSeq": seqs[-3]}
        )
        assert [int(e["event"]["seq"]) for e in resumed] == seqs[-2:]

        streamed = await call(
            client.server_stream,
            CONTROL,
            "WatchStream",
            {"runId": run_id, "taskKey": "publish", "fromOffset": 1},
        )
        assert [a.get("chunks") for a in streamed if "chunks" in a] == [
            [{"position": "1", "attempt": 1, "attemptOffset": "1", "json": '{"n": 1}'}]
        ]
        assert [a["boundary"]["kind"] for a in streamed if "boundary" in a] == [
            "STREAM_BOUNDARY_KIND_STARTED",
            "STREAM_BOUNDARY_KIND_ENDED",
        ]

        other = await call(client.unary, CONTROL, "StartRun", {"workflowName": "reflected"})
        canceled = await call(
            client.unary,
            CONTROL,
            "CancelRun",
            {"runId": other["run"]["id"], "reason": "changed my mind"},
        )
        assert "cancelRequestedAt" in canceled["run"]

        workers = await call(client.unary, CONTROL, "ListWorkers", {"includeInactive": True})
        assert [(w["name"], w["labels"]) for w in workers["workers"]] == [
            ("reflector", {"via": "reflection"})
        ]
        stats = await call(client.unary, CONTROL, "GetStats", {})
        assert [(c["state"], c["count"]) for c in stats["runsByState"]] == [
            ("RUN_STATE_RUNNING", "1"),
            ("RUN_STATE_SUCCEEDED", "1"),
        ]

        drained = await call(client.unary, WORKER, "Drain", {"session": session})
        assert drained["sessionState"] == "WORKER_STATE_STOPPED"
    finally:
        await call(channel.close)


async def test_schedule_rpcs_through_reflection(awp_server: ServerHandle) -> None:
    """The Schedules calls of docs/grpcurl.md, with its JSON bodies."""
    channel = grpc.insecure_channel(awp_server.address)
    client = ReflectionClient(channel)
    call = asyncio.to_thread
    try:
        await call(client.unary, CONTROL, "CreateWorkflow", {"definition": definition()})
        nightly = {
            "name": "nightly",
            "workflowName": "reflected",
            "cron": "0 2 * * *",
            "timezone": "Europe/Paris",
            "overlap": "OVERLAP_POLICY_SKIP",
            "catchup": "CATCHUP_POLICY_ALL",
            "catchupWindow": "60s",
            "input": {"lang": "en"},
        }
        created = await call(client.unary, CONTROL, "CreateSchedule", {"schedule": nightly})
        assert created["schedule"]["nextFireTime"].endswith(":00:00Z")
        reindex = {
            "name": "reindex",
            "workflowName": "reflected",
            "interval": "900s",
            "overlap": "OVERLAP_POLICY_BUFFER_ONE",
        }
        await call(client.unary, CONTROL, "CreateSchedule", {"schedule": reindex})
        listed = await call(client.unary, CONTROL, "ListSchedules", {"pageSize": 100})
        assert [s["spec"]["name"] for s in listed["schedules"]] == ["nightly", "reindex"]
        changed = {**nightly, "cron": "30 6 * * 1-5"}
        await call(client.unary, CONTROL, "UpdateSchedule", {"schedule": changed})
        for method in ("PauseSchedule", "ResumeSchedule"):
            await call(client.unary, CONTROL, method, {"name": "nightly"})
        triggered = await call(client.unary, CONTROL, "TriggerSchedule", {"name": "nightly"})
        assert triggered["runId"] and triggered["tickTime"]
        got = await call(client.unary, CONTROL, "GetSchedule", {"name": "nightly"})
        assert got["schedule"]["recentTicks"][0]["source"] == "trigger"
        window = {"startTime": "2026-12-01T00:00:00Z", "endTime": "2026-12-01T02:00:00Z"}
        backfilled = await call(
            client.unary, CONTROL, "BackfillSchedule", {"name": "reindex", **window}
        )
        assert len(backfilled["runIds"]) == 9
        again = await call(client.unary, CONTROL, "BackfillSchedule", {"name": "reindex", **window})
        assert again == {"alreadyFired": 9}
        await call(client.unary, CONTROL, "DeleteSchedule", {"name": "nightly"})
        delayed = await call(
            client.unary,
            CONTROL,
            "StartRun",
            {"workflowName": "reflected", "startDelay": "3600s"},
        )
        assert delayed["run"]["state"] == "RUN_STATE_RUNNING" and delayed["run"]["startTime"]
    finally:
        await call(channel.close)


def reflect(address: str, service: str, request: Message, answer: type[Message]) -> Any:
    """One ServerReflectionInfo exchange with `service` (a version of reflection)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=type(request).SerializeToString,
            response_deserializer=answer.FromString,
        )
        [response] = list(call(iter([request]), timeout=10))
    return response


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_answers_in_v1_and_v1alpha(awp_server: ServerHandle, version: str) -> None:
    """grpcurl and Postman ask v1 first, older clients v1alpha: each lists every service
    and describes itself (what `grpcurl describe` needs)."""
    package = f"grpc.reflection.{version}"
    service = f"{package}.ServerReflection"
    # The versions' messages match field for field: v1alpha's ask for the file that
    # describes this version, and the messages built from that file ask the rest.
    described = await asyncio.to_thread(
        reflect,
        awp_server.address,
        service,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=service),
        reflection_pb2.ServerReflectionResponse,
    )
    [serialized] = described.file_descriptor_response.file_descriptor_proto
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(serialized)
    info = pool.FindServiceByName(service).methods_by_name["ServerReflectionInfo"]
    assert info.input_type.full_name == f"{package}.ServerReflectionRequest"
    request = message_factory.GetMessageClass(info.input_type)
    listed = await asyncio.to_thread(
        reflect,
        awp_server.address,
        service,
        request(list_services=""),
        message_factory.GetMessageClass(info.output_type),
    )
    assert {s.name for s in listed.list_services_response.service} == {
        CONTROL,
        WORKER,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }


async def test_errors_carry_reasons_over_reflection(awp_server: ServerHandle) -> None:
    """Status details arrive whatever the client: grpcurl prints them from the trailers."""
    channel = grpc.insecure_channel(awp_server.address)
    client = ReflectionClient(channel)
    try:
        for args, code, reason in (
            ((CONTROL, "GetWorkflow", {"name": "missing"}), "NOT_FOUND", "WORKFLOW_NOT_FOUND"),
            ((CONTROL, "GetStats", {}, "wrong-token"), "UNAUTHENTICATED", "TOKEN_INVALID"),
        ):
            try:
                await asyncio.to_thread(client.unary, *args)
            except grpc.RpcError as error:
                assert error.code().name == code
                assert error_reason(error) == reason
            else:
                raise AssertionError(f"{args[1]} succeeded")
    finally:
        await asyncio.to_thread(channel.close)


def error_reason(error: grpc.RpcError) -> str:
    reason = decode_details(error.trailing_metadata()).reason  # type: ignore[attr-defined]
    assert reason, "no ErrorInfo in a grpc-status-details-bin trailer"
    return reason
