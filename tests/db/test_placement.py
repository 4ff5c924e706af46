"""Placement over real PostgreSQL (docs/design.md §17): required labels, resources held
by the lease and counted together within one claim, preferred labels and sticky runs
with their fallback bound, the grant's refusal of what no active worker could run and
its explanation; and the placement invariants (kit.invariants.placement) fire on a
corrupted history."""

from __future__ import annotations

import time
from uuid import UUID

import pytest

from awp_db import dispatching, grant
from awp_db.connect import Pool
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.placement import Placement
from awp_protocol.errors import FieldsInvalid
from kit import poll_until, start_run
from kit.db import DbWorker, dispatch_all, register
from kit.invariants import InvariantViolation, check_committed


def placed(count: int, placement: Placement, *, name: str = "placed") -> WorkflowSpec:
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            tasks=tuple(
                TaskSpec(key=f"t{i}", executor_kind="mock", action="noop", placement=placement)
                for i in range(count)
            ),
        )
    )


def chain(second: Placement, *, name: str = "chain") -> WorkflowSpec:
    """a, then b (with `second`'s placement)."""
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            tasks=(
                TaskSpec(key="a", executor_kind="mock", action="noop"),
                TaskSpec(
                    key="b",
                    executor_kind="mock",
                    action="noop",
                    depends_on=("a",),
                    placement=second,
                ),
            ),
        )
    )


async def why(pool: Pool, run_id: UUID) -> dict[str, str]:
    async with pool.acquire() as conn:
        return await grant.explain(conn, run_id)


async def test_required_labels_are_always_honoured(pool: Pool) -> None:
    await start_run(pool, placed(4, Placement.of(["gpu=a100"])))
    plain = await register(pool, max_concurrency=10, name="plain")
    other = await register(pool, max_concurrency=10, name="h100", labels={"gpu": "h100"})
    a100 = await register(pool, max_concurrency=10, name="a100", labels={"gpu": "a100"})
    assert await dispatch_all(pool) == 4
    assert await plain.claim() == [] and await other.claim() == []
    assert len(await a100.claim()) == 4
    await check_committed(pool)


async def test_resources_are_held_by_the_lease_and_counted_together(pool: Pool) -> None:
    await start_run(pool, placed(5, Placement.of(resources={"gpu": 1})))
    gpu = await register(pool, max_concurrency=10, resources={"gpu": 2})
    await dispatch_all(pool)
    # One claim of ten slots: two fit, counted together within the claim.
    first = await gpu.claim(10)
    assert len(first) == 2
    assert await gpu.claim(10) == []
    # The lease's end frees its unit at its commit.
    assert await gpu.complete(first[0]) == "ACCEPTED"
    await dispatch_all(pool)
    assert len(await gpu.claim(10)) == 1
    assert await gpu.claim(10) == []
    await check_committed(pool)


async def test_several_resources_and_capacity_per_worker(pool: Pool) -> None:
    await start_run(pool, placed(4, Placement.of(resources={"gpu": 1, "vram_gb": 40})))
    small = await register(pool, max_concurrency=10, resources={"gpu": 2, "vram_gb": 30})
    big = await register(pool, max_concurrency=10, resources={"gpu": 4, "vram_gb": 80})
    await dispatch_all(pool)
    assert await small.claim() == []  # never enough vram
    assert len(await big.claim()) == 2  # vram bounds it before gpu does
    await check_committed(pool)


async def test_placed_offers_are_bounded_by_the_room_of_the_workers_that_fit(
    pool: Pool,
) -> None:
    # Offers only the GPU worker may take must not fill the kind's budget: the CPU
    # worker's slots are offered the other work.
    await start_run(pool, placed(10, Placement.of(["gpu=a100"], resources={"gpu": 1})))
    await start_run(pool, placed(10, Placement.of(), name="plain"))
    gpu = await register(
        pool, max_concurrency=4, name="gpu", labels={"gpu": "a100"}, resources={"gpu": 2}
    )
    cpu = await register(pool, max_concurrency=4, name="cpu")
    await dispatch_all(pool)
    offered = await pool.fetch(
        """SELECT cardinality(resource_names) > 0 AS gpu, count(*) AS n FROM dispatches
            WHERE state = 'pending' GROUP BY 1"""
    )
    # Two GPU offers (its two free units), the rest of the eight slots for the others.
    assert {row["gpu"]: row["n"] for row in offered} == {True: 2, False: 6}
    assert len(await cpu.claim()) == 4
    assert len(await gpu.claim()) == 4  # its two GPUs, and two slots of other work
    await check_committed(pool)


async def test_a_task_no_active_worker_could_run_is_not_granted_and_says_why(pool: Pool) -> None:
    run = await start_run(pool, placed(1, Placement.of(["gpu=a100"], resources={"gpu": 3})))
    await register(pool, max_concurrency=10)
    assert await dispatch_all(pool) == 0
    assert (await why(pool, run))["t0"] == "no active worker with label gpu=a100"
    await register(pool, max_concurrency=10, labels={"gpu": "a100"}, resources={"gpu": 2})
    assert await dispatch_all(pool) == 0
    assert (await why(pool, run))["t0"] == (
        "no active worker with 3 units of resource gpu and labels gpu=a100"
    )
    await register(pool, max_concurrency=10, labels={"gpu": "a100"}, resources={"gpu": 4})
    assert await dispatch_all(pool) == 1


async def test_exhausted_resources_are_explained(pool: Pool) -> None:
    run = await start_run(pool, placed(3, Placement.of(resources={"gpu": 1})))
    gpu = await register(pool, max_concurrency=10, resources={"gpu": 2})
    await dispatch_all(pool)
    assert len(await gpu.claim()) == 2
    assert (await why(pool, run))["t2"] == (
        "resource 'gpu' exhausted (2 of 2 reserved on the matching workers)"
    )


async def test_an_offer_whose_only_fitting_worker_left_is_withdrawn(pool: Pool) -> None:
    run = await start_run(pool, placed(1, Placement.of(["zone=eu"])))
    await register(pool, max_concurrency=10)
    eu = await register(pool, max_concurrency=10, labels={"zone": "eu"})
    assert await dispatch_all(pool) == 1
    await pool.execute(
        "UPDATE workers SET state = 'offline', stopped_at = now() WHERE id = $1", eu.id
    )
    async with pool.acquire() as conn:
        assert await dispatching.withdraw_unservable(conn) == 1
    assert (await why(pool, run))["t0"] == "no active worker with label zone=eu"


async def test_a_sticky_task_prefers_its_runs_last_worker_then_falls_back(pool: Pool) -> None:
    await start_run(pool, chain(Placement.of(sticky=True)))
    first = await register(pool, max_concurrency=10, name="first")
    await dispatch_all(pool)
    (a,) = await first.claim()
    other = await register(pool, max_concurrency=10, name="other")
    assert await first.complete(a) == "ACCEPTED"
    granted_at = time.monotonic()
    assert await dispatch_all(pool) == 1
    sticky, until = await pool.fetchrow(
        "SELECT sticky_worker, prefer_until FROM dispatches WHERE state = 'pending'"
    )
    assert sticky == first.id and until is not None
    assert await other.claim() == []
    # Its worker busy (here: not claiming), anyone takes it once the bound has passed.
    (b,) = await poll_until(other.claim, "the fallback to another worker", within=30)
    assert b.task_key == "b"
    assert time.monotonic() - granted_at >= grant.PLACEMENT_FALLBACK_MS / 1000 * 0.9
    await check_committed(pool)


async def test_a_sticky_task_goes_to_its_worker_first(pool: Pool) -> None:
    await start_run(pool, chain(Placement.of(sticky=True)))
    first = await register(pool, max_concurrency=10, name="first")
    await dispatch_all(pool)
    (a,) = await first.claim()
    other = await register(pool, max_concurrency=10, name="other")
    assert await first.complete(a) == "ACCEPTED"
    await dispatch_all(pool)
    assert await other.claim() == []
    assert [lease.task_key for lease in await first.claim()] == ["b"]
    await check_committed(pool)


async def test_a_sticky_task_whose_worker_is_gone_goes_to_anyone_at_once(pool: Pool) -> None:
    await start_run(pool, chain(Placement.of(sticky=True)))
    first = await register(pool, max_concurrency=10, name="first")
    await dispatch_all(pool)
    (a,) = await first.claim()
    assert await first.complete(a) == "ACCEPTED"
    await first.drain()
    other = await register(pool, max_concurrency=10, name="other")
    await dispatch_all(pool)
    assert [lease.task_key for lease in await other.claim()] == ["b"]


async def test_sticky_never_overrides_required_labels(pool: Pool) -> None:
    # Hatchet #4936: sticky assignment silently disabled labels. Here the sticky worker
    # lacks the label, so it is not preferred at all: the labelled worker takes it at once.
    await start_run(pool, chain(Placement.of(["gpu=a100"], sticky=True)))
    first = await register(pool, max_concurrency=10, name="first")
    await dispatch_all(pool)
    (a,) = await first.claim()
    a100 = await register(pool, max_concurrency=10, name="a100", labels={"gpu": "a100"})
    assert await first.complete(a) == "ACCEPTED"
    await dispatch_all(pool)
    assert await first.claim() == []
    assert [lease.task_key for lease in await a100.claim()] == ["b"]
    await check_committed(pool)


async def test_preferred_labels_and_models(pool: Pool) -> None:
    run = await start_run(pool, placed(2, Placement.of(preferred_labels=["model=llama3-8b"])))
    plain = await register(pool, max_concurrency=10, name="plain")
    loaded = await register(pool, max_concurrency=1, name="loaded", models=["llama3-8b", "qwen"])
    await dispatch_all(pool)
    assert await plain.claim() == []
    assert (await why(pool, run))["t0"].startswith("preferring labels model=llama3-8b until")
    assert len(await loaded.claim()) == 1
    # The preferred worker is full; the other task falls back after the bound.
    (late,) = await poll_until(plain.claim, "the fallback", within=30)
    assert late.task_key == "t1"
    await check_committed(pool)


async def test_map_elements_carry_the_placement(pool: Pool) -> None:
    await start_run(pool, placed(1, Placement.of(["gpu=a100"], resources={"gpu": 1})))
    rows = await pool.fetch("SELECT required_labels, resource_names, resource_units FROM tasks")
    assert [(list(r[0]), list(r[1]), list(r[2])) for r in rows] == [(["gpu=a100"], ["gpu"], [1])]


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (Placement.of(["gpu"]), "required_labels[0]: task 't0': 'gpu' is not key=value"),
        (Placement.of(preferred_labels=["a b=c"]), "preferred_labels[0]: task 't0': 'a b=c'"),
        (Placement.of(resources={"gpu": 0}), "task 't0': resource 'gpu': units must be"),
        (Placement.of(resources={"gpu": -2}), "got -2"),
        (Placement.of(["x=1", "x=1"]), "task 't0': lists a label twice"),
    ],
)
async def test_bad_placement_is_refused_naming_the_task(
    placement: Placement, expected: str
) -> None:
    with pytest.raises(FieldsInvalid) as caught:
        placed(1, placement)
    assert expected in str(caught.value), caught.value


# --- the invariants have teeth --------------------------------------------------------


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def _leased(pool: Pool, workflow: WorkflowSpec, **worker: object) -> DbWorker:
    await start_run(pool, workflow)
    holder = await register(pool, max_concurrency=10, **worker)  # type: ignore[arg-type]
    await dispatch_all(pool)
    assert await holder.claim()
    await check_committed(pool)
    return holder


async def test_a_lease_over_a_workers_capacity_is_found(pool: Pool) -> None:
    holder = await _leased(
        pool, placed(3, Placement.of(resources={"gpu": 1})), resources={"gpu": 2}
    )
    await pool.execute("UPDATE workers SET resource_units = '{1}' WHERE id = $1", holder.id)
    assert "reserved 2 of resource 'gpu', over its capacity 1" in await _violations(pool)


async def test_a_lease_to_a_worker_without_the_required_label_is_found(pool: Pool) -> None:
    holder = await _leased(pool, placed(1, Placement.of(["gpu=a100"])), labels={"gpu": "a100"})
    await pool.execute("UPDATE workers SET placement_labels = '{}' WHERE id = $1", holder.id)
    assert "requires labels ['gpu=a100']" in await _violations(pool)


async def test_a_preferred_dispatch_taken_early_by_another_worker_is_found(pool: Pool) -> None:
    await _leased(pool, placed(1, Placement.of()))
    await pool.execute(
        """UPDATE dispatches SET preferred_labels = '{model=x}',
                  prefer_until = leased_at + interval '1 minute'"""
    )
    await pool.execute("UPDATE tasks SET preferred_labels = '{model=x}'")
    assert "preferred worker None / labels ['model=x']" in await _violations(pool)


async def test_a_dispatch_not_carrying_its_tasks_placement_is_found(pool: Pool) -> None:
    await _leased(pool, placed(1, Placement.of()))
    await pool.execute("UPDATE tasks SET required_labels = '{gpu=a100}'")
    assert "does not carry its task's placement" in await _violations(pool)
