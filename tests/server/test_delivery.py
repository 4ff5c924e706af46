"""Every answer is deliverable to a client with gRPC's default 4 MiB receive limit,
however large the outputs (DESIGN.md §4 "Sizes"): a Claim issues only the leases one
answer can carry, a lease names the upstream outputs it leaves out and its holder
fetches them with GetUpstreamOutputs, GetRun leaves large outputs out (GetTaskOutput)
and lists at most 10,000 tasks (ListTasks pages through any number)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from awp.v1 import control_pb2_grpc, runs_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from awp_db import coordination
from awp_db.connect import Pool
from awp_protocol.errors import Reason, decode_details
from awp_protocol.jsonvalue import canonical_json, parse_object, struct_to_dict
from awp_protocol.limits import MAX_OUTPUT_BYTES, MAX_RESPONSE_BYTES
from awp_server import control_service, delivery
from kit import ADMIN_TOKEN, ServerHandle, poll_until, spec, start_run
from kit.db import dispatch_all
from kit.rawworker import RawWorker, register

# gRPC's own default, set explicitly so that the test does not depend on it.
CLIENT_RECEIVE_BYTES = 4 * 1024 * 1024
UPSTREAMS = 9


@pytest.fixture
async def small_channel(awp_server: ServerHandle) -> AsyncIterator[grpc.aio.Channel]:
    options = [("grpc.max_receive_message_length", CLIENT_RECEIVE_BYTES)]
    async with grpc.aio.insecure_channel(awp_server.address, options=options) as channel:
        yield channel


@pytest.fixture
def stub(small_channel: grpc.aio.Channel) -> worker_pb2_grpc.WorkerServiceStub:
    return worker_pb2_grpc.WorkerServiceStub(small_channel)


def big_output(index: int, size: int) -> dict[str, Any]:
    """An output of about `size` bytes of JSON whose content depends on index."""
    line = hashlib.sha256(str(index).encode()).hexdigest()
    return {"index": index, "text": (line * (size // len(line) + 1))[:size]}


def fan_in() -> Any:
    """t0..t8 independent, t9 depends on all of them."""
    return spec("fan-in", tasks=UPSTREAMS + 1, depends={UPSTREAMS: list(range(UPSTREAMS))})


async def complete_upstreams(
    pool: Pool, worker: RawWorker, outputs: dict[str, dict[str, Any]]
) -> None:
    await dispatch_all(pool)
    leases = await worker.claim(len(outputs))
    assert sorted(lease.task_key for lease in leases) == sorted(outputs)
    for lease in leases:
        await worker.complete(lease, outputs[lease.task_key])


async def claim_downstream(pool: Pool, worker: RawWorker) -> worker_pb2.Lease:
    async def leased() -> worker_pb2.Lease | None:
        await dispatch_all(pool)
        leases = await worker.claim(1)
        return leases[0] if leases else None

    return await poll_until(leased, within=20)


async def fetch_all(
    worker: RawWorker, lease: worker_pb2.Lease, token: str = ""
) -> tuple[dict[str, dict[str, Any]], int]:
    """The lease's omitted outputs, fetched as a worker does; and the pages it took."""
    found: dict[str, dict[str, Any]] = {}
    wanted = list(lease.omitted_upstream_keys)
    pages = 0
    while wanted:
        answer = await worker.stub.GetUpstreamOutputs(
            worker_pb2.GetUpstreamOutputsRequest(
                session=worker.session,
                dispatch_id=lease.dispatch_id,
                lease_token=token or lease.lease_token,
                keys=wanted,
            ),
            timeout=10,
        )
        assert answer.outputs, "an answer always carries at least one output"
        assert answer.ByteSize() <= MAX_RESPONSE_BYTES
        pages += 1
        for output in answer.outputs:
            found[output.key] = parse_object(output.output_json)
        wanted = [key for key in wanted if key not in found]
    return found, pages


async def test_large_upstream_outputs_reach_the_holder_through_a_4_mib_client(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, fan_in())
    worker = await register(stub, concurrency=UPSTREAMS + 1)
    # Three small outputs travel inline; six of almost 1 MiB each cannot (5.6 MiB).
    outputs = {
        f"t{i}": big_output(i, 100 if i < 3 else MAX_OUTPUT_BYTES - 200) for i in range(UPSTREAMS)
    }
    await complete_upstreams(pool, worker, outputs)
    lease = await claim_downstream(pool, worker)
    inline = {key: struct_to_dict(value) for key, value in lease.upstream_outputs.items()}
    assert inline == {f"t{i}": outputs[f"t{i}"] for i in range(3)}
    assert list(lease.omitted_upstream_keys) == [f"t{i}" for i in range(3, UPSTREAMS)]
    fetched, pages = await fetch_all(worker, lease)
    assert {**inline, **fetched} == outputs
    # Byte for byte: the canonical JSON the worker receives is what was completed.
    for key, output in fetched.items():
        assert canonical_json(output) == canonical_json(outputs[key])
    assert pages >= 2
    print(f"\nFIGURE upstream outputs: {len(fetched)} of ~1 MiB fetched in {pages} answers")


async def test_only_the_live_holder_may_fetch_upstream_outputs(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    await start_run(pool, fan_in())
    worker = await register(stub, concurrency=UPSTREAMS + 1)
    outputs = {f"t{i}": big_output(i, 100_000) for i in range(UPSTREAMS)}
    await complete_upstreams(pool, worker, outputs)
    lease = await claim_downstream(pool, worker)
    assert len(lease.omitted_upstream_keys) == UPSTREAMS

    async def refusal(**change: Any) -> grpc.aio.AioRpcError:
        request = worker_pb2.GetUpstreamOutputsRequest(
            session=worker.session,
            dispatch_id=lease.dispatch_id,
            lease_token=lease.lease_token,
            keys=["t0"],
        )
        for field, value in change.items():
            if field == "keys":
                del request.keys[:]
                request.keys.extend(value)
            else:
                setattr(request, field, value)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetUpstreamOutputs(request, timeout=10)
        return caught.value

    forged = await refusal(lease_token="x" * 43)
    assert forged.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert decode_details(forged.trailing_metadata()).reason == Reason.LEASE_LOST
    foreign = await refusal(keys=["t0", "t9"])
    assert foreign.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert decode_details(foreign.trailing_metadata()).violations[0].field == "keys[1]"
    # Another session, even with the right token, is not the holder.
    other = await register(stub)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await fetch_all(other, lease)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Once the result is in, the lease is over: nothing more to fetch.
    await worker.complete(lease, {"done": True})
    stale = await refusal()
    assert decode_details(stale.trailing_metadata()).reason == Reason.LEASE_LOST


async def test_a_claim_issues_only_the_leases_one_answer_can_carry(
    stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    # 24 leases of 2 x ~60 KiB inputs would be 2.9 MiB of JSON (up to 16 MiB encoded).
    tasks = 24
    text = "x" * 60_000
    run_id = await start_run(
        pool, spec("wide", tasks=tasks, task_input={"text": text}), run_input={"text": text}
    )
    worker = await register(stub, concurrency=tasks)
    await dispatch_all(pool)
    claimed: list[worker_pb2.Lease] = []
    answers = 0
    while len(claimed) < tasks:
        answer = await stub.Claim(
            worker_pb2.ClaimRequest(session=worker.session, max_leases=tasks), timeout=10
        )
        assert answer.leases, "pending dispatches are always claimable"
        assert answer.ByteSize() <= MAX_RESPONSE_BYTES
        answers += 1
        claimed += answer.leases
        # No lease exists that was not delivered: the rest are still pending.
        leased = await pool.fetchval(
            "SELECT count(*) FROM dispatches WHERE run_id = $1 AND state = 'leased'", run_id
        )
        assert leased == len(claimed)
    assert len({lease.dispatch_id for lease in claimed}) == tasks
    assert all(struct_to_dict(lease.input)["text"] == text for lease in claimed)
    print(f"\nFIGURE claim budget: {tasks} leases of ~120 KiB inputs in {answers} answers")


async def test_get_run_leaves_large_outputs_out_and_get_task_output_returns_them(
    awp_server: ServerHandle,
    small_channel: grpc.aio.Channel,
    stub: worker_pb2_grpc.WorkerServiceStub,
    pool: Pool,
) -> None:
    run_id = await start_run(pool, spec("large-outputs", tasks=6))
    worker = await register(stub, concurrency=6)
    outputs = {f"t{i}": big_output(i, 10 if i == 0 else MAX_OUTPUT_BYTES - 200) for i in range(6)}
    await complete_upstreams(pool, worker, outputs)
    control = control_pb2_grpc.ControlServiceStub(small_channel)
    auth = (("authorization", f"Bearer {ADMIN_TOKEN}"),)

    async def finished() -> runs_pb2.GetRunResponse | None:
        answer: runs_pb2.GetRunResponse = await control.GetRun(
            runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=auth, timeout=10
        )
        return answer if answer.run.finished_at.seconds else None

    answer = await poll_until(finished, within=20)
    assert answer.ByteSize() <= MAX_RESPONSE_BYTES
    shown = {task.key: task for task in answer.tasks}
    assert struct_to_dict(shown["t0"].output) == outputs["t0"]
    assert not shown["t0"].output_omitted
    assert all(shown[f"t{i}"].output_omitted for i in range(1, 6))
    for key, output in outputs.items():
        fetched = await control.GetTaskOutput(
            runs_pb2.GetTaskOutputRequest(run_id=str(run_id), task_key=key),
            metadata=auth,
            timeout=10,
        )
        assert fetched.output_json.encode() == canonical_json(output)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await control.GetTaskOutput(
            runs_pb2.GetTaskOutputRequest(run_id=str(run_id), task_key="nope"),
            metadata=auth,
            timeout=10,
        )
    assert decode_details(caught.value.trailing_metadata()).violations[0].field == "task_key"


async def test_get_run_of_a_run_with_many_failures_stays_within_the_budget(
    small_channel: grpc.aio.Channel, stub: worker_pb2_grpc.WorkerServiceStub, pool: Pool
) -> None:
    # 300 tasks failing with 8 KiB messages, 2 attempts each: ~7 MiB of errors.
    tasks = 300
    run_id = await start_run(pool, spec("failing", tasks=tasks, max_attempts=2))
    worker = await register(stub, concurrency=tasks)
    for _ in range(2):

        async def some_leased() -> list[worker_pb2.Lease] | None:
            async with pool.acquire() as conn:
                await coordination.release_retries(conn)
            await dispatch_all(pool)
            return await worker.claim(tasks) or None

        leases: list[worker_pb2.Lease] = []
        while len(leases) < tasks:
            leases += await poll_until(some_leased, within=20)
        for lease in leases:
            await worker.fail(lease, "e" * 8000, retryable=True)
    control = control_pb2_grpc.ControlServiceStub(small_channel)
    auth = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    answer = await control.GetRun(
        runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=auth, timeout=10
    )
    assert answer.ByteSize() <= MAX_RESPONSE_BYTES
    assert len(answer.tasks) == tasks
    assert answer.attempts_omitted > 0
    assert len(answer.attempts) + answer.attempts_omitted == 2 * tasks
    print(
        f"\nFIGURE GetRun budget: {len(answer.attempts)} of {2 * tasks} attempts shown, "
        f"{answer.ByteSize()} bytes"
    )


async def test_get_run_lists_its_first_rows_and_list_tasks_pages_through_every_task(
    small_channel: grpc.aio.Channel,
    stub: worker_pb2_grpc.WorkerServiceStub,
    pool: Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GetRun's row cap (10,000: the first map elements past it) made small to test.
    monkeypatch.setattr(control_service, "MAX_GET_RUN_ROWS", 5)
    tasks = 12
    run_id = await start_run(pool, spec("many", tasks=tasks))
    worker = await register(stub, concurrency=tasks)
    await complete_upstreams(pool, worker, {f"t{i}": {"i": i} for i in range(tasks)})
    control = control_pb2_grpc.ControlServiceStub(small_channel)
    auth = (("authorization", f"Bearer {ADMIN_TOKEN}"),)

    answer = await control.GetRun(
        runs_pb2.GetRunRequest(run_id=str(run_id)), metadata=auth, timeout=10
    )
    assert [task.key for task in answer.tasks] == [f"t{i}" for i in range(5)]
    assert answer.tasks_omitted == tasks - 5
    assert sum(count.count for count in answer.run.tasks_by_state) == tasks
    assert len(answer.attempts) == 5 and answer.attempts_omitted == tasks - 5

    request = runs_pb2.ListTasksRequest(run_id=str(run_id), page_size=5)
    pages: list[list[str]] = []
    while True:
        page = await control.ListTasks(request, metadata=auth, timeout=10)
        pages.append([task.key for task in page.tasks])
        assert all(struct_to_dict(task.output) == {"i": int(task.key[1:])} for task in page.tasks)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert pages == [[f"t{i}" for i in range(s, min(s + 5, tasks))] for s in range(0, tasks, 5)]

    for token in ("nonsense", "dDox"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await control.ListTasks(
                runs_pb2.ListTasksRequest(run_id=str(run_id), page_token=token),
                metadata=auth,
                timeout=10,
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert decode_details(caught.value.trailing_metadata()).violations[0].field == "page_token"


def test_a_tasks_page_over_the_budget_ends_early_and_keeps_its_first_task() -> None:
    # 1,000 tasks failing with the longest message and traceback: ~24 MiB.
    answer = runs_pb2.ListTasksResponse(
        tasks=[
            runs_pb2.Task(
                key=f"t{i:04d}",
                error=types_pb2.TaskError(message="m" * 8000, traceback="t" * 16_000),
            )
            for i in range(1000)
        ]
    )
    delivery.trim_tasks(answer)
    assert answer.ByteSize() <= MAX_RESPONSE_BYTES
    assert answer.tracebacks_omitted == 1000
    assert [task.key for task in answer.tasks] == [f"t{i:04d}" for i in range(len(answer.tasks))]
    assert 300 < len(answer.tasks) < 1000
