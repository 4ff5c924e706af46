"""Map tasks against real PostgreSQL, driven through the storage calls workers and the
coordinator make: elements created in the transaction that accepts the upstream's
success, each element its own task with its own attempts; the map task's output its
elements' outputs in order; empty, too wide and non-list upstream values; an element's
permanent failure; retries per element; the run's concurrency; maps over maps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from uuid import UUID

import pytest
from coordinator_support import coordinator

from awp_db import claims, runs
from awp_db.connect import Pool
from awp_kernel.definition import MapSpec, TaskSpec, WorkflowSpec, validate
from awp_kernel.retry import RetryPolicy
from awp_protocol.limits import MAX_INPUT_BYTES, MAX_MAP_ELEMENTS, MAX_OUTPUT_BYTES
from kit import start_run
from kit.db import DbWorker, converge_cancel, register, run_state, task_states
from kit.invariants import Expect, check_committed, check_invariants
from kit.lifecycles import EVENT_LIFECYCLES, illegal_moves, recorded_moves

Output = Callable[[claims.IssuedLease], dict[str, Any]]


def task(key: str, deps: Iterable[str] = (), **fields: Any) -> TaskSpec:
    fields.setdefault("retry", RetryPolicy(3, 0, 1000, 2.0))
    fields.setdefault("timeout_ms", 60_000)
    return TaskSpec(key=key, executor_kind="mock", action="act", depends_on=tuple(deps), **fields)


def workflow(name: str, *tasks: TaskSpec, concurrency: int = 0) -> WorkflowSpec:
    return validate(WorkflowSpec(name=name, version=1, tasks=tasks, concurrency=concurrency))


def search_flow(name: str = "research", **search: Any) -> WorkflowSpec:
    """plan -> search (once per element of plan's output["queries"]) -> summarize."""
    return workflow(
        name,
        task("plan"),
        task("search", ["plan"], map=MapSpec("plan", "queries"), input={"engine": "web"}, **search),
        task("summarize", ["search"]),
    )


def answers(queries: Any) -> Output:
    """plan returns these queries; each element echoes its input; the rest their upstream."""

    def output(lease: claims.IssuedLease) -> dict[str, Any]:
        if lease.task_key == "plan":
            return {"queries": queries}
        if "[" in lease.task_key:  # an element
            return {"found": lease.input, "key": lease.task_key}
        return {"upstream": lease.upstream_outputs}

    return output


async def drive(
    pool: Pool,
    worker: DbWorker,
    run_id: UUID,
    output: Output,
    *,
    fail: Iterable[str] = (),
    claim: int = 1000,
) -> list[claims.IssuedLease]:
    """Dispatches, claims and completes until the run ends (tasks in `fail` fail for
    good); checks the committed-state invariants after every step."""
    failing = set(fail)
    seen: list[claims.IssuedLease] = []
    for _ in range(100):
        if await run_state(pool, run_id) != "running":
            return seen
        issued = await worker.dispatch_and_claim(claim)
        assert issued, f"run {run_id} is stuck: {await task_states(pool, run_id)}"
        seen.extend(issued)
        ok = [lease for lease in issued if lease.task_key not in failing]
        bad = [lease for lease in issued if lease.task_key in failing]
        if ok:
            assert set(await worker.complete_all(ok, output=output)) == {"ACCEPTED"}
        if bad:
            await worker.complete_all(bad, "failed", retryable=False)
        await check_committed(pool)
    raise AssertionError("the run did not end")


async def test_a_map_runs_once_per_element_and_hands_the_outputs_on_in_order(
    pool: Pool,
) -> None:
    worker = await register(pool, max_concurrency=100)
    run_id = await start_run(pool, search_flow())
    queries = [f"q{i}" for i in range(7)]
    leases = await drive(pool, worker, run_id, answers(queries))

    assert await run_state(pool, run_id) == "succeeded"
    by_key = {lease.task_key: lease for lease in leases}
    elements = [by_key[f"search[{i}]"] for i in range(7)]
    for index, element in enumerate(elements):
        # The map task's input, plus the element and its index.
        assert element.input == {"engine": "web", "item": f"q{index}", "index": index}
        assert element.action == "act" and element.attempt == 1
        assert element.upstream_outputs == {"plan": {"queries": queries}}
    # Each element its own lease, fencing token and idempotency key (its own task key).
    assert len({e.fencing_token for e in elements}) == len({e.dispatch_id for e in elements}) == 7
    summary_input = by_key["summarize"].upstream_outputs["search"]
    assert summary_input == {"outputs": [{"found": e.input, "key": e.task_key} for e in elements]}
    tasks = {t.key: t for t in await runs.tasks(pool, run_id)}
    assert tasks["search"].output == summary_input and tasks["search"].attempts == 0
    assert [(t.map_parent, t.map_index) for t in await runs.tasks(pool, run_id)][3:] == [
        ("search", i) for i in range(7)
    ]
    costs = await check_invariants(pool, {run_id: Expect()})
    assert costs[run_id].executions == 9  # plan, 7 elements, summarize: each once

    moves = await recorded_moves(pool)
    assert illegal_moves(EVENT_LIFECYCLES["task.state"][0], moves["task.state"]) == []
    search_moves = await pool.fetch(
        "SELECT from_state, to_state FROM state_events WHERE task_key = 'search' ORDER BY seq"
    )
    assert [tuple(m) for m in search_moves] == [
        (None, "pending"),
        ("pending", "running"),
        ("running", "succeeded"),
    ]


async def test_the_elements_are_created_with_the_upstream_success(pool: Pool) -> None:
    """In the very transaction that accepts plan's result: READY, with one event each."""
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    assert await worker.complete(plan, output={"queries": ["a", "b", "c"]}) == "ACCEPTED"
    states = await task_states(pool, run_id)
    assert states == {
        "plan": "succeeded",
        "search": "running",
        "search[0]": "ready",
        "search[1]": "ready",
        "search[2]": "ready",
        "summarize": "pending",
    }
    revision_of_plan = await pool.fetchval(
        "SELECT revision FROM state_events WHERE task_key = 'plan' AND to_state = 'succeeded'"
    )
    created = await pool.fetch(
        "SELECT revision FROM state_events WHERE task_key LIKE 'search[%' AND to_state = 'ready'"
    )
    assert [row["revision"] for row in created] == [revision_of_plan] * 3
    await check_committed(pool)


async def test_an_empty_list_succeeds_at_once(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    assert await worker.complete(plan, output={"queries": []}) == "ACCEPTED"
    # Same transaction: the map task succeeded and its downstream is ready.
    states = await task_states(pool, run_id)
    assert states == {"plan": "succeeded", "search": "succeeded", "summarize": "ready"}
    (summarize,) = await worker.dispatch_and_claim()
    assert summarize.upstream_outputs == {"search": {"outputs": []}}
    await worker.complete(summarize)
    await check_invariants(pool, {run_id: Expect()})


@pytest.mark.parametrize(
    ("plan_output", "problem"),
    [
        (
            {"queries": list(range(MAX_MAP_ELEMENTS + 1))},
            "has 1001 elements; a map task takes at most 1000",
        ),
        ({"queries": {"a": 1}}, "is a JSON object, not a list"),
        ({"queries": "abc"}, "is a JSON string, not a list"),
        ({"queries": None}, "is null, not a list"),
        ({"other": [1]}, "is missing (expected a list)"),
    ],
)
async def test_a_value_that_cannot_be_mapped_fails_the_map_task(
    pool: Pool, plan_output: dict[str, Any], problem: str
) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    assert await worker.complete(plan, output=plan_output) == "ACCEPTED"

    assert await run_state(pool, run_id) == "failed"
    tasks = {t.key: t for t in await runs.tasks(pool, run_id)}
    assert tasks["search"].state == "failed"
    assert tasks["search"].error == {
        "message": f"map over 'plan': the value at 'queries' in its output {problem}",
        "retryable": False,
    }
    assert tasks["summarize"].state == "skipped"
    assert len(tasks) == 3  # no element was created
    await check_invariants(
        pool,
        {
            run_id: Expect(
                "failed", {"plan": "succeeded", "search": "failed", "summarize": "skipped"}
            )
        },
    )


async def test_the_longest_list_a_map_takes(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    assert (
        await worker.complete(plan, output={"queries": list(range(MAX_MAP_ELEMENTS))}) == "ACCEPTED"
    )
    count = await pool.fetchval(
        "SELECT count(*) FROM tasks WHERE run_id = $1 AND map_index IS NOT NULL", run_id
    )
    assert count == MAX_MAP_ELEMENTS
    await check_committed(pool)


async def test_an_element_failing_for_good_fails_the_map_and_stops_its_siblings(
    pool: Pool,
) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": ["a", "b", "c", "d"]})
    first, second = await worker.dispatch_and_claim(2)  # the other two stay queued
    assert (first.task_key, second.task_key) == ("search[0]", "search[1]")
    assert await worker.complete(first, "failed", retryable=False) == "ACCEPTED"

    tasks = {t.key: t for t in await runs.tasks(pool, run_id)}
    assert tasks["search"].state == "failed"
    assert tasks["search"].error == {
        "message": "element 0 (search[0]) failed: boom",
        "retryable": False,
    }
    assert {k: t.state for k, t in tasks.items()} == {
        "plan": "succeeded",
        "search": "failed",
        "summarize": "skipped",
        "search[0]": "failed",
        "search[1]": "canceled",  # it was running: its lease is revoked
        "search[2]": "skipped",
        "search[3]": "skipped",
    }
    assert await run_state(pool, run_id) == "failed"
    assert await worker.complete(second) == "LEASE_LOST"
    await check_invariants(
        pool,
        {
            run_id: Expect(
                "failed",
                {
                    "plan": "succeeded",
                    "search": "failed",
                    "summarize": "skipped",
                    "search[0]": "failed",
                    "search[1]": "canceled",
                },
                default_task_state="skipped",
            )
        },
    )


async def test_retry_and_timeout_apply_per_element(pool: Pool) -> None:
    coord = coordinator(pool)
    worker = await register(pool, max_concurrency=20)
    run_id = await start_run(pool, search_flow(timeout_ms=20_000))
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": ["a", "b", "c"]})
    elements = await worker.dispatch_and_claim()
    assert [lease.max_attempts for lease in elements] == [3, 3, 3]
    # Each element's attempt has the map task's timeout (the other tasks have 60 s).
    assert all(10_000 < lease.attempt_remaining_ms <= 20_000 for lease in elements)
    flaky = elements[1]
    assert await worker.complete(flaky, "failed", retryable=True) == "ACCEPTED"
    await worker.complete_all([elements[0], elements[2]])
    assert (await task_states(pool, run_id))["search[1]"] == "waiting_retry"
    assert (await task_states(pool, run_id))["search"] == "running"

    await coord.run_pass()  # the retry timer (no backoff) releases it, and it is dispatched
    (again,) = await worker.claim()
    assert (again.task_key, again.attempt) == ("search[1]", 2)
    assert again.input == flaky.input and again.fencing_token > flaky.fencing_token
    await worker.complete(again)
    await drive(pool, worker, run_id, answers([]))
    costs = await check_invariants(pool, {run_id: Expect()})
    assert costs[run_id].extra_executions == 1


async def test_run_concurrency_counts_elements_not_the_map_task(pool: Pool) -> None:
    flow = workflow(
        "limited",
        task("plan"),
        task("search", ["plan"], map=MapSpec("plan", "queries")),
        concurrency=3,
    )
    worker = await register(pool, max_concurrency=50)
    run_id = await start_run(pool, flow)
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": list(range(10))})
    most = 0
    while await run_state(pool, run_id) == "running":
        issued = await worker.dispatch_and_claim(50)
        # The running map task itself takes no slot: three elements run at once.
        assert len(issued) == 3 or (issued and await _left(pool, run_id) < 3)
        most = max(most, len(issued))
        await check_committed(pool)
        await worker.complete_all(issued)
    assert most == 3
    await check_invariants(pool, {run_id: Expect()})


async def _left(pool: Pool, run_id: UUID) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM tasks WHERE run_id = $1 AND state NOT IN ('succeeded')", run_id
    )
    return count


async def test_maps_over_maps(pool: Pool) -> None:
    """A map task over another's outputs; with an empty list every level ends at once."""
    flow = workflow(
        "nested",
        task("plan"),
        task("first", ["plan"], map=MapSpec("plan", "queries")),
        task("second", ["first"], map=MapSpec("first", "outputs")),
        task("done", ["second"]),
    )
    worker = await register(pool, max_concurrency=50)
    empty = await start_run(pool, flow)
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": []})
    assert await task_states(pool, empty) == {
        "plan": "succeeded",
        "first": "succeeded",
        "second": "succeeded",
        "done": "ready",
    }
    await drive(pool, worker, empty, answers([]))

    full = await start_run(pool, flow, "nested-full")
    leases = await drive(pool, worker, full, answers(["x", "y"]))
    second = sorted(
        (lease for lease in leases if lease.task_key.startswith("second[")),
        key=lambda lease: lease.task_key,
    )
    # Each element of `second` got the output of the element of `first` at its index.
    assert [lease.input["item"]["key"] for lease in second] == ["first[0]", "first[1]"]
    done = next(lease for lease in leases if lease.task_key == "done")
    assert [o["key"] for o in done.upstream_outputs["second"]["outputs"]] == [
        "second[0]",
        "second[1]",
    ]
    await check_invariants(pool, {empty: Expect(), full: Expect()})


async def test_cancel_with_a_map_in_flight(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": list(range(6))})
    leased = await worker.dispatch_and_claim(2)
    await worker.complete(leased[0])
    async with pool.acquire() as conn:
        assert await runs.request_cancel(conn, run_id, "enough", "test")
    await converge_cancel(pool, run_id)

    assert await run_state(pool, run_id) == "canceled"
    states = await task_states(pool, run_id)
    assert states["search"] == "canceled" and states["search[0]"] == "succeeded"
    assert {states[f"search[{i}]"] for i in range(1, 6)} == {"canceled"}
    assert await worker.complete(leased[1]) == "LEASE_LOST"
    await check_invariants(
        pool,
        {
            run_id: Expect(
                "canceled",
                {"plan": "succeeded", "search[0]": "succeeded"},
                default_task_state="canceled",
            )
        },
    )


async def test_elements_share_capacity_fairly_with_other_runs(pool: Pool) -> None:
    """The dispatcher's round-robin serves a run's elements like any ready tasks: a run
    with a wide map does not starve a run started after it."""
    worker = await register(pool, max_concurrency=4)
    wide = await start_run(pool, search_flow("wide"))
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": list(range(30))})
    narrow = await start_run(pool, workflow("narrow", *(task(f"n{i}") for i in range(5))))
    issued = await worker.dispatch_and_claim(4)
    by_run: dict[UUID, int] = {}
    for lease in issued:
        by_run[lease.run_id] = by_run.get(lease.run_id, 0) + 1
    assert by_run == {wide: 2, narrow: 2}


async def test_outputs_too_large_together_fail_the_map_task(pool: Pool) -> None:
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    await worker.complete(plan, output={"queries": list(range(5))})
    # Each well within a task's limit, together over it.
    blob = "x" * (MAX_OUTPUT_BYTES // 5 + 1000)
    await worker.complete_all(await worker.dispatch_and_claim(), output=lambda _: {"blob": blob})
    tasks = {t.key: t for t in await runs.tasks(pool, run_id)}
    assert tasks["search"].state == "failed" and tasks["search"].output is None
    assert tasks["search"].error is not None
    message = tasks["search"].error["message"]
    size = int(message.removeprefix("the outputs of its elements come to ").split()[0])
    assert size > MAX_OUTPUT_BYTES
    assert message.endswith(f"a task's output is at most {MAX_OUTPUT_BYTES} bytes")
    assert await run_state(pool, run_id) == "failed"
    await check_committed(pool, finished=True)


async def test_an_element_too_large_for_an_input_fails_the_map_task(pool: Pool) -> None:
    """Each element's input travels in its lease: it is bounded like any input."""
    worker = await register(pool)
    run_id = await start_run(pool, search_flow())
    (plan,) = await worker.dispatch_and_claim()
    queries = ["small", "y" * MAX_INPUT_BYTES]
    assert await worker.complete(plan, output={"queries": queries}) == "ACCEPTED"
    tasks = {t.key: t for t in await runs.tasks(pool, run_id)}
    assert tasks["search"].state == "failed" and len(tasks) == 3
    assert tasks["search"].error is not None
    assert "has an element that makes an input of" in tasks["search"].error["message"]
    assert tasks["search"].error["message"].endswith(f"an input is at most {MAX_INPUT_BYTES}")
    # Just under the limit is taken.
    again = await start_run(pool, search_flow(), "again")
    (plan,) = await worker.dispatch_and_claim()
    room = MAX_INPUT_BYTES - len('{"item": "", "index": 0, "engine": "web"}')
    assert await worker.complete(plan, output={"queries": ["z" * room]}) == "ACCEPTED"
    assert (await task_states(pool, again))["search[0]"] == "ready"
