"""The coordinator's `due` pre-read agrees with each step's own candidate query and with
its Python twin (grant.refill_due), over generated database states.

`due` restates every step's candidate condition in one unlocked read; a pass skips the
steps it says have nothing to do, so a condition that drifted from its step's would
leave work undone until the next scan. Times are hours away from now, so the database
clock moving during an example never changes an answer.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from awp_db import coordination, grant, locks
from awp_db.queries import queries
from awp_db.workers import OfflineRule
from awp_protocol.limits import MAX_PRIORITY, MIN_PRIORITY

KINDS = ("a", "b", "c")
# A session is silent after 3 of its own heartbeat intervals, and at least a minute: with
# the two intervals below, two hours of silence is offline for one and not the other.
OFFLINE = OfflineRule(intervals=3, floor_ms=60_000)
# Seconds from now: far enough that no answer depends on when a query reads the clock.
OFFSETS = st.sampled_from([-7200.0, -3600.0, 3600.0, 7200.0])

WORKERS = st.lists(
    st.fixed_dictionaries(
        {
            "state": st.sampled_from(["active", "active", "draining", "stopped", "offline"]),
            "kinds": st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True),
            "max_concurrency": st.integers(1, 3),
            "silent": st.booleans(),
            "heartbeat_interval_ms": st.sampled_from([5_000, 3_600_000]),
        }
    ),
    max_size=4,
)
DISPATCHES = st.none() | st.fixed_dictionaries(
    {"holder": st.none() | st.integers(0, 3), "expires_in": OFFSETS, "deadline_in": OFFSETS}
)
TASKS = st.lists(
    st.fixed_dictionaries(
        {
            "state": st.sampled_from(
                ["pending", "ready", "queued", "running", "waiting_retry", "succeeded"]
            ),
            "kind": st.sampled_from(KINDS),
            "retry_in": OFFSETS,
            "dispatch": DISPATCHES,
        }
    ),
    max_size=6,
)
# Servers' serving stretches (heartbeat_silence_from): live (last seen now) or stale for
# an hour, begun one or two hours ago; none at all is the rule without server rows.
SERVERS = st.lists(
    st.fixed_dictionaries(
        {"since": st.sampled_from([-7200.0, -3600.0]), "seen": st.sampled_from([-3600.0, 0.0])}
    ),
    max_size=3,
)
RUNS = st.lists(
    st.fixed_dictionaries(
        {
            "state": st.sampled_from(["running", "running", "succeeded", "canceled"]),
            "cancel": st.booleans(),
            "tasks": TASKS,
        }
    ),
    max_size=3,
)

# A kind whose offers sit between the two marks: no free slot, two offers pending, and
# half the prefetch (2 of 3 slots) not exceeded. Refilling at the full prefetch instead
# would differ here.
_LEASED = {"holder": 0, "expires_in": 3600.0, "deadline_in": 7200.0}
_PENDING = {"holder": None, "expires_in": 3600.0, "deadline_in": 7200.0}
BETWEEN_THE_MARKS = {
    "fleet": [
        {
            "state": "active",
            "kinds": ["a"],
            "max_concurrency": 3,
            "silent": False,
            "heartbeat_interval_ms": 5_000,
        }
    ],
    "runs": [
        {
            "state": "running",
            "cancel": False,
            "tasks": [
                {"state": state, "kind": "a", "retry_in": 3600.0, "dispatch": dispatch}
                for state, dispatch in [("running", _LEASED)] * 3 + [("queued", _PENDING)] * 2
            ],
        }
    ],
    "prefetch": 1.0,
    "servers": [],
}

COORDINATION = queries("coordination")
DISPATCHING = queries("dispatching")
GRANT = queries("grant")


async def _insert(
    conn: asyncpg.Connection,
    fleet: list[dict[str, Any]],
    runs: list[Any],
    servers: list[dict[str, float]],
) -> None:
    for server in servers:
        await conn.execute(
            """INSERT INTO servers (id, serving_since, last_seen_at, stale_after_ms)
               VALUES (gen_random_uuid(), now() + $1 * interval '1 second',
                       now() + $2 * interval '1 second', 60000)""",
            server["since"],
            server["seen"],
        )
    worker_ids = [
        await conn.fetchval(
            """INSERT INTO workers (name, protocol_version, executor_kinds, max_concurrency,
                                    session_token_hash, state, last_heartbeat_at, stopped_at,
                                    heartbeat_interval_ms)
               VALUES ('w', 1, $1, $2, $3, $4,
                       now() - CASE WHEN $5 THEN interval '2 hours' ELSE interval '0' END,
                       CASE WHEN $4 IN ('stopped', 'offline') THEN now() END, $6)
               RETURNING id""",
            w["kinds"],
            w["max_concurrency"],
            bytes(32),
            w["state"],
            w["silent"],
            w["heartbeat_interval_ms"],
        )
        for w in fleet
    ]
    workflow_id = await conn.fetchval(
        """INSERT INTO workflows (name, version, definition, definition_hash)
           VALUES ('due', 1, '{}', $1) RETURNING id""",
        bytes(32),
    )
    for run in runs:
        run_id = await conn.fetchval(
            """INSERT INTO runs (workflow_id, state, finished_at, cancel_requested_at)
               VALUES ($1, $2, CASE WHEN $2 <> 'running' THEN now() END,
                       CASE WHEN $3 THEN now() END)
               RETURNING id""",
            workflow_id,
            run["state"],
            run["cancel"],
        )
        for number, task in enumerate(run["tasks"]):
            await _insert_task(conn, run_id, f"t{number}", task, worker_ids)


async def _insert_task(
    conn: asyncpg.Connection, run_id: Any, key: str, task: dict[str, Any], worker_ids: list[Any]
) -> None:
    task_id = await conn.fetchval(
        """INSERT INTO tasks (run_id, key, executor_kind, action, unfinished_deps, state,
                              max_attempts, backoff_initial_ms, backoff_max_ms,
                              backoff_multiplier, timeout_ms, retry_at, finished_at)
           VALUES ($1, $2, $3, 'act', CASE WHEN $4 = 'pending' THEN 1 ELSE 0 END, $4,
                   3, 0, 0, 1, 1000,
                   CASE WHEN $4 = 'waiting_retry' THEN now() + $5 * interval '1 second' END,
                   CASE WHEN $4 = 'succeeded' THEN now() END)
           RETURNING id""",
        run_id,
        key,
        task["kind"],
        task["state"],
        task["retry_in"],
    )
    dispatch = task["dispatch"]
    if dispatch is None:
        return
    holder = None
    if dispatch["holder"] is not None and worker_ids:
        holder = worker_ids[dispatch["holder"] % len(worker_ids)]
    if holder is None:
        await conn.execute(
            "INSERT INTO dispatches (run_id, task_id, executor_kind) VALUES ($1, $2, $3)",
            run_id,
            task_id,
            task["kind"],
        )
        return
    expires_in, deadline_in = sorted((dispatch["expires_in"], dispatch["deadline_in"]))
    await conn.execute(
        """INSERT INTO dispatches (run_id, task_id, executor_kind, state, worker_id,
                                   lease_token_hash, fencing_token, leased_at,
                                   lease_expires_at, attempt_deadline)
           VALUES ($1, $2, $3, 'leased', $4, $5, nextval('fencing_tokens'), now(),
                   now() + $6 * interval '1 second', now() + $7 * interval '1 second')""",
        run_id,
        task_id,
        task["kind"],
        holder,
        bytes(32),
        expires_in,
        deadline_in,
    )


async def _exists(conn: asyncpg.Connection, query: str, *args: Any) -> bool:
    return bool(await conn.fetch(query, *args))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(fleet=WORKERS, runs=RUNS, prefetch=st.sampled_from([0.0, 0.5, 1.0]), servers=SERVERS)
@example(**BETWEEN_THE_MARKS)
async def test_due_agrees_with_every_step_and_its_python_twin(
    conn: asyncpg.Connection,
    fleet: list[dict[str, Any]],
    runs: list[Any],
    prefetch: float,
    servers: list[dict[str, float]],
) -> None:
    transaction = conn.transaction()
    await transaction.start()
    try:
        await _insert(conn, fleet, runs, servers)
        due = await coordination.due(conn, OFFLINE, prefetch)

        assert due.cancels == await _exists(conn, COORDINATION["cancel_requested"], 1)
        assert due.silent_workers == bool(
            await locks.silent_sessions(conn, OFFLINE.intervals, OFFLINE.floor_ms)
        )
        assert due.expired_leases == await _exists(conn, COORDINATION["expired_leases"], 1)
        assert due.retries == await _exists(conn, COORDINATION["due_retries"], 1)
        assert due.unservable == await _exists(conn, DISPATCHING["unservable"], 1)
        # `ready` is the cheap pre-check of dispatch's candidates: never false when the
        # dispatch pass would find one.
        if await _exists(
            conn,
            GRANT["candidates"],
            list(KINDS),
            100,
            grant.AGING_STEP_MS,
            MIN_PRIORITY,
            MAX_PRIORITY,
        ):
            assert due.ready

        capacity = await conn.fetch(DISPATCHING["capacity"])
        assert due.short == any(
            grant.refill_due(row["free"], row["slots"], row["open_pending"], prefetch)
            for row in capacity
        )

        # The next timer is overdue exactly when a timed step has work now, and absent
        # exactly when nothing is timed.
        timed = await conn.fetchval(
            """SELECT EXISTS (SELECT 1 FROM dispatches WHERE state = 'leased')
                   OR EXISTS (SELECT 1 FROM tasks WHERE state = 'waiting_retry')
                   OR EXISTS (SELECT 1 FROM workers WHERE state IN ('active', 'draining'))"""
        )
        assert (due.next_due_in is not None) == timed
        overdue = due.next_due_in is not None and due.next_due_in <= 0
        assert overdue == (due.expired_leases or due.retries or due.silent_workers)
    finally:
        await transaction.rollback()
