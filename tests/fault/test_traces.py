"""OpenTelemetry traces across real processes (docs/observability.md): a real OTLP/gRPC
receiver (kit.otlp), one server, one coordinator and two workers, each exporting its
spans there; a caller whose own span starts the run through the SDK; a worker killed
with -9 while it runs a task.

The run's spans form one connected trace rooted at the caller's span: the run, each
task's queue wait, each attempt with its identity (worker, fencing token, outcome), the
action's code and the user's own span inside it, each Complete's answer (an event on
the attempt's span); the killed
worker's attempt appears as the coordinator's rescue of it, and the next attempt has a
higher fencing token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import traced_actions
import workload
from cluster import ADMIN_AUTH, Cluster, WorkerProcess, wait_for
from commandlines import ADMIN_TOKEN
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from probes import wait_attempt, wait_run
from victims import kill_holding

from awp.v1 import control_pb2
from awp_common import tracing
from awp_common.processes import command
from awp_sdk import AsyncClient
from kit.invariants import Expect
from kit.otlp import OtlpReceiver, ReceivedSpan, Receiver

pytestmark = pytest.mark.fault

SLOW_S = 4.0
# Every attempt span, whoever exports it, says which attempt it is and how it ended.
ATTEMPT_ATTRIBUTES = (
    tracing.RUN_ID,
    tracing.TASK_KEY,
    tracing.ATTEMPT,
    tracing.WORKER_ID,
    tracing.FENCING_TOKEN,
    tracing.OUTCOME,
)


@pytest.fixture
async def received(cluster: Cluster) -> AsyncIterator[Receiver]:
    """A receiver every process of the cluster exports to."""
    otlp = OtlpReceiver()
    async with otlp as receiver:
        cluster.env.update(otlp.env())
        # The workers import the scenario's action module (traced_actions.py, beside this).
        cluster.env["PYTHONPATH"] = str(Path(__file__).parent)
        yield receiver


@pytest.fixture
def caller(received: Receiver, cluster: Cluster) -> Iterator[TracerProvider]:
    """The application's own tracing (its OpenTelemetry SDK), exporting to the receiver."""
    provider = TracerProvider(resource=Resource.create({"service.name": "caller-app"}))
    endpoint = cluster.env["OTEL_EXPORTER_OTLP_ENDPOINT"]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint, insecure=True)))
    yield provider
    provider.shutdown()


async def start_python_worker(cluster: Cluster, name: str) -> WorkerProcess:
    t = cluster.timings
    argv = [
        *command("awp-worker"),
        "--server", cluster.server_address,
        "--worker-token", "fault-worker-token",
        "--name", name,
        "--kinds", "python",
        "--module", "traced_actions",
        "--concurrency", "1",
        "--safety-margin", str(t.safety_margin_s),
        "--claim-wait", str(t.claim_wait_s),
        "--metrics-listen", "off",
        "--log-format", "json",
    ]  # fmt: skip
    return await cluster.start_foreign_worker(name, argv)


async def start_in_caller_span(
    cluster: Cluster, caller: TracerProvider, name: str, tasks: list[workload.Task], action: str
) -> tuple[UUID, tuple[str, str]]:
    """A run of ``tasks`` (python actions), started through the SDK inside the caller's
    own span; its id, and the trace id and span id of the caller's span."""
    definition = workload.definition(name, tasks)
    for task in definition.tasks:
        task.executor_kind, task.action = "python", action
    await cluster.control().CreateWorkflow(
        control_pb2.CreateWorkflowRequest(definition=definition), metadata=ADMIN_AUTH, timeout=10
    )
    async with AsyncClient(cluster.server_address, token=ADMIN_TOKEN) as client:
        with caller.get_tracer("caller-app").start_as_current_span("caller.handle_request") as own:
            handle = await client.start(name)
    context = own.get_span_context()
    # The SDK's exporter thread calls the receiver served on this loop: never block it.
    await asyncio.to_thread(caller.force_flush)
    return UUID(handle.id), (f"{context.trace_id:032x}", f"{context.span_id:016x}")


async def start_traced_run(
    cluster: Cluster, caller: TracerProvider
) -> tuple[UUID, tuple[str, str]]:
    """prep -> slow."""
    tasks = [
        workload.Task("prep", input={"sleep_ms": 50}),
        workload.Task("slow", depends_on=["prep"], input={"sleep_ms": SLOW_S * 1000}),
    ]
    return await start_in_caller_span(cluster, caller, "traced", tasks, "traced.work")


def assert_connected(spans: list[ReceivedSpan], caller_span_id: str) -> None:
    """One connected trace, rooted at the caller's own span."""
    by_id = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    assert [(r.name, r.span_id) for r in roots] == [("caller.handle_request", caller_span_id)]
    orphans = [s.name for s in spans if s.parent_span_id and s.parent_span_id not in by_id]
    assert orphans == []


def attempt_spans(spans: list[ReceivedSpan], key: str, attempt: int) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name == tracing.ATTEMPT_SPAN
        and s.attributes.get(tracing.TASK_KEY) == key
        and s.attributes.get(tracing.ATTEMPT) == attempt
    ]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def log_lines(worker: WorkerProcess) -> Iterator[dict[str, Any]]:
    for line in worker.process.output(current_only=False).splitlines():
        if line.startswith("{"):
            yield json.loads(line)


async def test_one_trace_per_run_from_the_caller_through_a_rescue(
    cluster: Cluster, received: Receiver, caller: TracerProvider
) -> None:
    await cluster.start_server()
    await cluster.start_coordinator()
    workers = [await start_python_worker(cluster, name) for name in ("w1", "w2")]
    run_id, (trace_id, caller_span_id) = await start_traced_run(cluster, caller)
    stored = await cluster.fetchval("SELECT trace_id FROM runs WHERE id = $1", run_id)
    assert stored == trace_id  # the run continues the caller's trace

    # prep's spans all reached the receiver (its attempt's span, which ends once its
    # Complete is answered, is its worker's last): killing that worker loses none of them.
    await wait_for(
        lambda: attempt_spans(received.spans, "prep", 1), "prep's attempt span", within=30
    )
    first = await wait_attempt(cluster, run_id, "slow", 1, "running")
    victim = cluster.worker_of(first["worker_id"])
    survivor = next(w for w in workers if w is not victim)
    await kill_holding(cluster, victim, SLOW_S)
    await wait_run(cluster, run_id, within=60)

    def complete() -> bool:
        spans = received.trace(trace_id)
        return any(s.name == tracing.RUN_SPAN for s in spans) and bool(
            attempt_spans(spans, "slow", 2)
        )

    await wait_for(complete, "the run's span and the last attempt's", within=30)
    spans = received.trace(trace_id)
    assert_connected(spans, caller_span_id)
    about_run = [s for s in received.spans if s.attributes.get(tracing.RUN_ID) == str(run_id)]
    assert {s.trace_id for s in about_run} == {trace_id}

    (run,) = [s for s in spans if s.name == tracing.RUN_SPAN]
    assert run.parent_span_id == caller_span_id
    assert run.service == "awp-coordinator"
    assert run.attributes[tracing.OUTCOME] == "succeeded"
    assert run.attributes[tracing.WORKFLOW] == "traced"

    # Each attempt, with its identity, as the database recorded it.
    recorded = {
        (row["key"], row["attempt"]): row
        for row in await cluster.fetch(
            """SELECT t.key, a.attempt, a.worker_id::text AS worker_id, a.fencing_token, a.state
                 FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE a.run_id = $1""",
            run_id,
        )
    }
    assert set(recorded) == {("prep", 1), ("slow", 1), ("slow", 2)}
    for (key, number), row in recorded.items():
        (span,) = attempt_spans(spans, key, number)
        assert span.parent_span_id == run.span_id
        assert all(name in span.attributes for name in ATTEMPT_ATTRIBUTES), span.attributes
        assert span.attributes[tracing.WORKER_ID] == row["worker_id"]
        assert span.attributes[tracing.FENCING_TOKEN] == row["fencing_token"]
        assert span.attributes[tracing.OUTCOME] == row["state"]
        (wait,) = [
            s
            for s in spans
            if s.name == tracing.QUEUE_WAIT_SPAN
            and s.attributes[tracing.TASK_KEY] == key
            and s.attributes[tracing.ATTEMPT] == number
        ]
        assert wait.parent_span_id == run.span_id and wait.service == "awp-server"
        assert wait.attributes[tracing.FENCING_TOKEN] == row["fencing_token"]

    # The action's code is the attempt's child, the user's own span the action's.
    for key, number in (("prep", 1), ("slow", 2)):
        (span,) = attempt_spans(spans, key, number)
        assert span.service == "awp-worker"
        (code,) = children(spans, span, tracing.ACTION_SPAN)
        (user,) = children(spans, code, traced_actions.USER_SPAN)
        assert user.attributes["user.task"] == key
        assert span.attributes[tracing.COMPLETE_OUTCOME] == "accepted"
        assert span.events == []  # Complete's answer is the attribute above
        assert span.attributes["awp.stream.chunks"] == 1

    # The killed worker's attempt: the coordinator's rescue, then a higher fencing token.
    (lost,) = attempt_spans(spans, "slow", 1)
    assert lost.service == "awp-coordinator" and lost.error
    assert lost.attributes[tracing.OUTCOME] == "interrupted"
    assert lost.attributes[tracing.WORKER_ID] == victim.worker_id
    events = [name for name, _ in lost.events]
    assert events == [tracing.EXPIRED_EVENT, tracing.RESCUE_EVENT]
    (again,) = attempt_spans(spans, "slow", 2)
    assert again.attributes[tracing.WORKER_ID] == survivor.worker_id
    assert again.attributes[tracing.FENCING_TOKEN] > lost.attributes[tracing.FENCING_TOKEN]
    assert again.start_ns >= lost.end_ns - 1_000_000_000  # the rescue came first (clock slack)
    reaps = [s for s in received.named(tracing.REAP_SPAN) if (trace_id, run.span_id) in s.links]
    assert reaps, "the reaping step's span links the run it rescued"

    # Log lines made inside a span carry its ids.
    (done,) = [
        line
        for line in log_lines(survivor)
        if line["msg"] == traced_actions.DONE_LINE and line.get("task_key") == "slow"
    ]
    (user,) = children(spans, children(spans, again, tracing.ACTION_SPAN)[0], "user.model_call")
    assert (done["trace_id"], done["span_id"]) == (trace_id, user.span_id)

    await cluster.check_invariants({run_id: Expect()})


async def test_a_durable_tasks_steps_and_waits_in_its_trace(
    cluster: Cluster, received: Receiver, caller: TracerProvider
) -> None:
    """A sync action's steps (one reporting its cost) and three waits: a sleep the
    coordinator's timer ends, a signal wait and an approval the server resumes. Each
    suspended attempt says so on its span, each wait is a span of the run from suspended
    to resumed, naming what ended it, and each step a span in its attempt's action: a
    miss, then hits."""
    await cluster.start_server()
    await cluster.start_coordinator()
    await start_python_worker(cluster, "w1")
    tasks = [workload.Task("agent")]
    run_id, (trace_id, caller_span_id) = await start_in_caller_span(
        cluster, caller, "durable", tasks, "traced.agent"
    )

    def waiting(kind: str) -> Any:
        return cluster.fetchval(
            "SELECT state = 'waiting' AND wait_kind = $2 FROM tasks WHERE run_id = $1",
            run_id,
            kind,
        )

    async with AsyncClient(cluster.server_address, token=ADMIN_TOKEN) as client:
        await wait_for(lambda: waiting("signal"), "the task waiting for its signal", within=60)
        sent = await client.send_signal(str(run_id), "go", {"n": 7})
        assert sent.delivered_to == "agent"
        await wait_for(lambda: waiting("approval"), "the task waiting for approval", within=60)
        await client.approve(str(run_id), "agent", "fine")
    await wait_run(cluster, run_id, within=60)
    attempts = await cluster.fetch(
        """SELECT a.attempt, a.state FROM attempts a WHERE a.run_id = $1 ORDER BY a.attempt""",
        run_id,
    )
    assert [(row["attempt"], row["state"]) for row in attempts] == [
        (1, "suspended"),
        (2, "suspended"),
        (3, "suspended"),
        (4, "succeeded"),
    ]

    def complete() -> bool:
        spans = received.trace(trace_id)
        return any(s.name == tracing.RUN_SPAN for s in spans) and bool(
            attempt_spans(spans, "agent", 4)
        )

    await wait_for(complete, "the run's span and the last attempt's", within=30)
    spans = received.trace(trace_id)
    assert_connected(spans, caller_span_id)
    (run,) = [s for s in spans if s.name == tracing.RUN_SPAN]

    # Each attempt's steps, in its action's span: (name, occurrence, hit, tokens).
    def steps(number: int) -> list[tuple[str, int, bool, int | None]]:
        (attempt,) = attempt_spans(spans, "agent", number)
        (code,) = children(spans, attempt, tracing.ACTION_SPAN)
        found = sorted(children(spans, code, tracing.STEP_SPAN), key=lambda s: s.start_ns)
        return [
            (
                s.attributes[tracing.STEP_NAME],
                s.attributes[tracing.STEP_OCCURRENCE],
                s.attributes[tracing.STEP_HIT],
                s.attributes.get(tracing.STEP_TOKENS),
            )
            for s in found
        ]

    assert steps(1) == [("draft", 0, False, 120)]
    assert steps(2) == [("draft", 0, True, 120)]
    assert steps(3) == [("draft", 0, True, 120)]
    assert steps(4) == [("draft", 0, True, 120), ("final", 0, False, None)]

    # The suspended attempts say where they stopped; the waits are spans of the run.
    waits = sorted([s for s in spans if s.name == tracing.WAIT_SPAN], key=lambda s: s.start_ns)
    assert [
        (
            w.attributes[tracing.WAIT_KIND],
            w.attributes[tracing.WAIT_RESUMED_BY],
            w.attributes[tracing.ATTEMPT],
            w.service,
        )
        for w in waits
    ] == [
        ("sleep", "timer", 1, "awp-coordinator"),
        ("signal", "signal", 2, "awp-server"),
        ("approval", "approval", 3, "awp-server"),
    ]
    for number, wait in zip((1, 2, 3), waits, strict=True):
        (suspended,) = attempt_spans(spans, "agent", number)
        (resumed,) = attempt_spans(spans, "agent", number + 1)
        assert wait.parent_span_id == run.span_id
        assert wait.attributes[tracing.TASK_KEY] == "agent"
        assert suspended.attributes["awp.cancel_reason"] == "suspended"
        kind = wait.attributes[tracing.WAIT_KIND]
        name = {"signal": "go", "approval": "approval"}.get(kind, "")
        event = {tracing.WAIT_KIND: kind, tracing.WAIT_NAME: name, tracing.WAIT_OCCURRENCE: 0}
        assert (tracing.SUSPENDED_EVENT, event) in suspended.events
        # suspended -> resumed, between the two attempts (clock slack: one machine).
        slack = 1_000_000_000
        assert suspended.start_ns - slack <= wait.start_ns <= suspended.end_ns + slack
        assert wait.end_ns <= resumed.start_ns + slack

    await cluster.check_invariants({run_id: Expect()})
