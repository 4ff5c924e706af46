"""Rate limits and token budgets in the grant rule (awp_db.grant, awp_db.ratelimits) over
real PostgreSQL: the window bounds what is granted, reported usage replaces the estimate
(refund and charge), a slow-down pauses the limit for everyone, an unset limit holds
nothing back; and the rate invariants (kit.invariants.flow) fire on a corrupted history."""

from __future__ import annotations

import pytest

from awp_db import grant, leases, ratelimits
from awp_db.connect import Pool
from awp_db.queries import queries
from awp_kernel.concurrency import ConcurrencyLimit
from awp_kernel.definition import TaskSpec, WorkflowSpec, validate
from awp_kernel.errors import AwpError
from awp_kernel.ratelimits import RateUse
from awp_protocol.results import CheckedResult
from kit import start_run
from kit.db import DbWorker, dispatch_all, register
from kit.invariants import InvariantViolation, check_committed

HOUR_MS = 3_600_000
DISPATCHING = queries("dispatching")


def rated(tasks: int, *uses: tuple[str, str], name: str = "rated") -> WorkflowSpec:
    return validate(
        WorkflowSpec(
            name=name,
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    rate_limits=tuple(RateUse(limit, units) for limit, units in uses),
                )
                for i in range(tasks)
            ),
        )
    )


async def set_limit(pool: Pool, name: str, units: int, period_ms: int = HOUR_MS) -> None:
    async with pool.acquire() as conn:
        await ratelimits.set_limit(conn, name, units, period_ms, "test")


async def used(pool: Pool, name: str) -> int:
    return (await ratelimits.get(pool, name)).used


async def complete_reporting(
    worker: DbWorker, lease_ids: list[int], tokens: dict[int, str], **reports: object
) -> None:
    results = [
        CheckedResult(d, tokens[d], "succeeded", output={}, **reports)  # type: ignore[arg-type]
        for d in lease_ids
    ]
    call = leases.Completion(str(worker.id), worker.session_token, results)
    async with worker.pool.acquire() as conn:
        (verdicts,) = await leases.complete_many(conn, [call])
    assert isinstance(verdicts, list) and all(v.name == "ACCEPTED" for v in verdicts)


async def test_a_rate_limit_bounds_the_units_granted_in_its_window(pool: Pool) -> None:
    await set_limit(pool, "api", 3)
    await start_run(pool, rated(10, ("api", "1")))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 3
    assert await dispatch_all(pool) == 0
    assert await used(pool, "api") == 3
    await check_committed(pool)


async def test_a_limit_no_one_set_holds_nothing_back(pool: Pool) -> None:
    await start_run(pool, rated(4, ("nobody-set-this", "5")))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 4
    assert await pool.fetchval("SELECT count(*) FROM rate_charges") == 0


async def test_units_from_the_run_input_and_reported_usage_refund_or_charge(
    pool: Pool,
) -> None:
    """A token budget of 1,000: each task estimates its max_tokens (400), so two fit; the
    first reports 100 really used, which frees 300: a third fits. The second reports 700
    (more than its estimate): charged, the budget is full again."""
    await set_limit(pool, "tpm", 1000)
    await start_run(pool, rated(5, ("tpm", "{input.max_tokens}")), run_input={"max_tokens": 400})
    worker = await register(pool, max_concurrency=50)
    first = await worker.dispatch_and_claim()
    assert len(first) == 2 and await used(pool, "tpm") == 800
    tokens = {lease.dispatch_id: lease.lease_token for lease in first}
    await complete_reporting(worker, [first[0].dispatch_id], tokens, usage=(("tpm", 100),))
    assert await used(pool, "tpm") == 500
    third = await worker.dispatch_and_claim()
    assert len(third) == 1 and await used(pool, "tpm") == 900
    await complete_reporting(worker, [first[1].dispatch_id], tokens, usage=(("tpm", 700),))
    assert await used(pool, "tpm") == 1200
    assert await dispatch_all(pool) == 0
    await check_committed(pool)


async def test_a_slow_down_report_pauses_the_limit_for_everyone(pool: Pool) -> None:
    await set_limit(pool, "api", 100)
    await start_run(pool, rated(3, ("api", "1")))
    worker = await register(pool, max_concurrency=1)
    (lease,) = await worker.dispatch_and_claim()
    await complete_reporting(
        worker, [lease.dispatch_id], {lease.dispatch_id: lease.lease_token},
        slow_down=(("api", 60_000),),
    )  # fmt: skip
    limit = await ratelimits.get(pool, "api")
    assert limit.paused and limit.paused_until is not None
    assert await dispatch_all(pool) == 0
    await pool.execute("UPDATE rate_limits SET paused_until = now() - interval '1 second'")
    assert await dispatch_all(pool) == 1


async def test_a_pause_committed_while_a_grant_waits_holds_its_tasks_back(pool: Pool) -> None:
    """The grant read the limit unpaused; a slow-down report's pause commits before the
    grant creates its dispatches (it waited for the run the report's Complete held):
    nothing is dispatched or charged under the pause."""
    await set_limit(pool, "api", 100)
    await start_run(pool, rated(2, ("api", "1")))
    await register(pool, max_concurrency=8)
    async with pool.acquire() as conn, conn.transaction():
        chosen = await grant.choose(conn, {"mock": 2}, None)
        assert len(chosen) == 2
        await pool.execute("UPDATE rate_limits SET paused_until = now() + interval '1 minute'")
        created = await conn.fetch(
            DISPATCHING["create"],
            [g.task_id for g in chosen],
            [g.priority for g in chosen],
            grant.PLACEMENT_FALLBACK_MS,
        )
    assert created == []
    assert await pool.fetchval("SELECT count(*) FROM rate_charges") == 0
    assert await pool.fetchval("SELECT count(*) FROM tasks WHERE state = 'ready'") == 2


async def test_a_run_whose_input_cannot_render_the_units_is_refused(pool: Pool) -> None:
    with pytest.raises(AwpError) as caught:
        await start_run(
            pool, rated(1, ("tpm", "{input.max_tokens}")), run_input={"max_tokens": "x"}
        )
    assert "units of rate limit 'tpm'" in str(caught.value)
    assert "{input.max_tokens} is 'x'" in str(caught.value)


async def test_an_unknown_limit_is_not_found(pool: Pool) -> None:
    with pytest.raises(AwpError) as caught:
        await ratelimits.get(pool, "missing")
    assert "rate limit 'missing'" in str(caught.value)


# --- the invariants have teeth --------------------------------------------------------


async def _violations(pool: Pool) -> str:
    with pytest.raises(InvariantViolation) as caught:
        await check_committed(pool)
    return str(caught.value)


async def test_a_window_charged_over_its_budget_is_found(pool: Pool) -> None:
    await set_limit(pool, "api", 2)
    await start_run(pool, rated(4, ("api", "1")))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 2
    await check_committed(pool)
    # As if a third grant had not counted the other two.
    await pool.execute(
        """WITH moved AS (
               UPDATE tasks SET state = 'queued'
                WHERE id = (SELECT min(id) FROM tasks WHERE state = 'ready') RETURNING *),
           made AS (
               INSERT INTO dispatches (run_id, task_id, executor_kind)
               SELECT run_id, id, executor_kind FROM moved RETURNING id)
           INSERT INTO rate_charges (dispatch_id, limit_name, granted_at, estimate,
                                     budget_units, period_ms)
           SELECT id, 'api', clock_timestamp(), 1, 2, 3600000 FROM made"""
    )
    assert "rate limit 'api': 3 units charged in the 3600000 ms ending" in (await _violations(pool))


async def test_a_charge_its_task_does_not_declare_is_found(pool: Pool) -> None:
    await set_limit(pool, "api", 10)
    await start_run(pool, rated(1, ("api", "1")))
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 1
    await pool.execute("UPDATE rate_charges SET estimate = 0")
    assert "charged 0 of 'api', which its task does not declare" in await _violations(pool)


async def test_a_held_back_task_says_why(pool: Pool) -> None:
    """grant.explain: a full key, a used-up or paused rate limit, no worker of the kind."""
    keyed = validate(
        WorkflowSpec(
            name="explained",
            version=1,
            tasks=tuple(
                TaskSpec(
                    key=f"t{i}",
                    executor_kind="mock",
                    action="noop",
                    concurrency_limits=(ConcurrencyLimit("k", 1),),
                )
                for i in range(2)
            ),
        )
    )
    run_id = await start_run(pool, keyed)
    async with pool.acquire() as conn:
        assert await grant.explain(conn, run_id) == {
            "t0": "waiting for a worker that runs executor kind 'mock'",
            "t1": "waiting for a worker that runs executor kind 'mock'",
        }
    await register(pool, max_concurrency=50)
    assert await dispatch_all(pool) == 1
    async with pool.acquire() as conn:
        assert await grant.explain(conn, run_id) == {
            "t1": "waiting for concurrency key 'k' (1 of 1 held)"
        }
    await set_limit(pool, "api", 1)
    rated_run = await start_run(pool, rated(2, ("api", "1")))
    assert await dispatch_all(pool) == 1
    async with pool.acquire() as conn:
        (why,) = (await grant.explain(conn, rated_run)).values()
    assert why == (
        "waiting for rate limit 'api' (1 of 1 units used in the last 3600000 ms; needs 1)"
    )
    await pool.execute("UPDATE rate_limits SET paused_until = now() + interval '1 hour'")
    async with pool.acquire() as conn:
        (why,) = (await grant.explain(conn, rated_run)).values()
    assert why.startswith("waiting for rate limit 'api' (paused by a slow-down until ")
