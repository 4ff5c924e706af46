"""ListWorkers and GetStats over real gRPC and PostgreSQL."""

from __future__ import annotations

from uuid import UUID

from awp.v1 import control_pb2, control_pb2_grpc, runs_pb2, types_pb2
from awp_db import dispatching, leases
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.placement import Placement
from control.helpers import create_workflow, start_run, task
from kit import start_run as start_spec
from kit.db import converge_cancel, register

Stub = control_pb2_grpc.ControlServiceStub


async def test_list_workers(control: Stub, pool: Pool) -> None:
    busy = await register(
        pool, ["mock", "python"], name="busy", max_concurrency=4, labels={"zone": "a"}
    )
    gone = await register(pool, name="gone")
    async with pool.acquire() as conn:
        await leases.drain(conn, str(gone.worker_id), gone.session_token, [])
    await create_workflow(control)
    await start_run(control)
    await busy.dispatch_and_claim()

    live = await control.ListWorkers(control_pb2.ListWorkersRequest())
    (info,) = live.workers
    assert info.id == str(busy.worker_id)
    assert (info.name, info.state) == ("busy", types_pb2.WORKER_STATE_ACTIVE)
    assert list(info.executor_kinds) == ["mock", "python"]
    assert (info.max_concurrency, info.active_leases, info.protocol_version) == (4, 1, 1)
    assert dict(info.labels) == {"zone": "a"}
    assert info.HasField("registered_at") and info.HasField("last_heartbeat_at")
    assert not info.HasField("stopped_at")

    everyone = await control.ListWorkers(control_pb2.ListWorkersRequest(include_inactive=True))
    states = {w.name: w for w in everyone.workers}
    assert states["gone"].state == types_pb2.WORKER_STATE_STOPPED
    assert states["gone"].HasField("stopped_at")
    # Newest first.
    assert [w.name for w in everyone.workers] == ["gone", "busy"]


async def test_stats_of_an_empty_system(control: Stub) -> None:
    stats = await control.GetStats(control_pb2.GetStatsRequest())
    assert stats == control_pb2.GetStatsResponse()
    assert not stats.HasField("oldest_pending")  # no queue, not a queue of age zero


async def test_stats_count_queues_runs_workers_and_leases(control: Stub, pool: Pool) -> None:
    await create_workflow(
        control,
        tasks=[
            task("m1"),
            task("m2"),
            task("m3"),
            task("p1", kind="python"),
            task("later", ["m1"]),
        ],
    )
    await start_run(control)
    canceled = await start_run(control)
    await control.CancelRun(runs_pb2.CancelRunRequest(run_id=canceled.id))
    await converge_cancel(pool, UUID(canceled.id))
    # One mock slot: the coordinator offers one dispatch per free slot, the worker takes it.
    worker = await register(pool, ["mock"], max_concurrency=1)
    leased = await worker.dispatch_and_claim()
    assert len(leased) == 1
    await register(pool, ["mock"], name="idle", max_concurrency=1)
    async with pool.acquire() as conn:
        await dispatching.create_dispatches(conn)

    stats = await control.GetStats(control_pb2.GetStatsRequest())
    # Only the running run's tasks: the canceled run's are history. Each list comes in
    # its enum's (lifecycle) order, then by executor kind.
    assert [(c.state, c.executor_kind, c.count) for c in stats.tasks_by_state] == [
        (types_pb2.TASK_STATE_PENDING, "mock", 1),
        (types_pb2.TASK_STATE_READY, "mock", 1),
        (types_pb2.TASK_STATE_READY, "python", 1),
        (types_pb2.TASK_STATE_QUEUED, "mock", 1),
        (types_pb2.TASK_STATE_RUNNING, "mock", 1),
    ]
    assert [(c.state, c.executor_kind, c.count) for c in stats.dispatches_by_state] == [
        (types_pb2.DISPATCH_STATE_PENDING, "mock", 1),
        (types_pb2.DISPATCH_STATE_LEASED, "mock", 1),
    ]
    assert [(c.state, c.count) for c in stats.runs_by_state] == [
        (types_pb2.RUN_STATE_RUNNING, 1),
        (types_pb2.RUN_STATE_CANCELED, 1),
    ]
    assert [(c.state, c.count) for c in stats.workers_by_state] == [
        (types_pb2.WORKER_STATE_ACTIVE, 2)
    ]
    assert stats.active_leases == 1
    assert stats.HasField("oldest_pending")
    assert stats.oldest_pending.ToMilliseconds() >= 0


async def test_list_workers_shows_models_resources_and_what_leases_reserve(
    control: Stub, pool: Pool
) -> None:
    gpu = await register(pool, models=["llama3-8b"], resources={"gpu": 2, "vram_gb": 80})
    await start_spec(
        pool,
        validate(
            WorkflowSpec(
                "gpu",
                1,
                (TaskSpec("t", "mock", "noop", placement=Placement.of(resources={"gpu": 1})),),
            )
        ),
    )
    assert len(await gpu.dispatch_and_claim()) == 1
    (info,) = (await control.ListWorkers(control_pb2.ListWorkersRequest())).workers
    assert list(info.models) == ["llama3-8b"]
    assert dict(info.resources) == {"gpu": 2, "vram_gb": 80}
    assert dict(info.reserved) == {"gpu": 1, "vram_gb": 0}
