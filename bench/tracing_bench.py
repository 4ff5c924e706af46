"""What tracing costs: single_run's throughput untraced and traced (bench.py's
``tracing`` scenario, docs/performance.md).

Each repetition measures both on fresh databases, one right after the other (the order
alternating between repetitions, so neither always runs on a warmer machine): every
process then exports its spans with OTLP/gRPC, at the SDK's default batching, to a real
receiver in this process (the tests' kit.otlp, on the OTLP protobuf definitions).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from cluster import Cluster, Window
from processes import PgProcesses, Postgres, wait_for

from awp_db.connect import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kit.otlp import OtlpReceiver

# A task of the benchmark makes these spans: its queue wait (server), its attempt and the
# action's code (worker); a run adds one (coordinator).
SPANS_PER_TASK = 3
# How long the traced processes get to export what they buffered, after the run.
EXPORT_WAIT_S = 30.0

Measure = Callable[[Cluster, Window], Awaitable[dict[str, Any]]]


async def _measured(
    pg: Postgres, database: str, workers: int, logdir: Path, env: Mapping[str, str],
    measure: Measure, after: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    await asyncio.to_thread(logdir.mkdir, parents=True, exist_ok=True)
    cluster = Cluster(pg, database, logdir, env)
    admin = await connect(pg.dsn, application_name="awp-bench-admin")
    try:
        await cluster.start(workers)
        figures = await measure(cluster, Window(cluster, PgProcesses(pg.data_dir), admin))
        if after is not None:
            await after()
        return figures
    finally:
        await admin.close()
        await cluster.stop()


async def tracing_overhead(
    pg: Postgres, workers: int, tasks: int, repetition: int, logdir: Path, measure: Measure
) -> dict[str, Any]:
    database = f"awp_bench_tracing_{workers}_{repetition}"
    otlp = OtlpReceiver()
    async with otlp as receiver:
        # The SDK's own batching (no faster schedule than production's).
        env = {k: v for k, v in otlp.env().items() if k != "OTEL_BSP_SCHEDULE_DELAY"}

        async def every_span() -> bool:
            return len(receiver.spans) >= SPANS_PER_TASK * tasks

        async def exported() -> None:
            # Fewer spans than expected show in spans_per_task, not as a failure.
            with contextlib.suppress(TimeoutError):
                await wait_for(every_span, "the spans", within=EXPORT_WAIT_S, every=0.1)

        async def untraced() -> dict[str, Any]:
            return await _measured(pg, f"{database}_off", workers, logdir / "untraced", {}, measure)

        async def traced() -> dict[str, Any]:
            return await _measured(
                pg, f"{database}_on", workers, logdir / "traced", env, measure, exported
            )

        if repetition % 2:
            off = await untraced()
            on = await traced()
        else:
            on = await traced()
            off = await untraced()
        spans = len(receiver.spans)
    on["tasks_per_s_untraced"] = off["tasks_per_s"]
    on["cpu_s_per_task_untraced"] = off["cpu_s_per_task"]
    # What tracing adds, in CPU time per task over every process (the server's, the
    # coordinator's, the workers' and PostgreSQL's): steadier than throughput on a
    # shared machine.
    on["tracing_cpu_us_per_task"] = 1e6 * sum(
        on["cpu_s_per_task"][kind] - off["cpu_s_per_task"][kind] for kind in off["cpu_s_per_task"]
    )
    on["tracing_drop_pct"] = 100.0 * (1.0 - on["tasks_per_s"] / off["tasks_per_s"])
    on["spans_per_task"] = spans / tasks
    return on
