"""PruneRuns over real gRPC and PostgreSQL: deletes finished runs past the age with their
rows, at most `limit` per call, saying what is left; a dry run pages through what it
would delete under one cutoff and deletes nothing; bad input names its field. (Roles:
tests/security/test_roles.py; the leader's own pruning: tests/coordinator.)"""

from __future__ import annotations

import logging
from datetime import timedelta

import grpc
import pytest

from awp.v1 import control_pb2, control_pb2_grpc
from awp_db.connect import Pool
from awp_protocol.errors import Reason
from control.helpers import expect_error
from kit import backlog, spec, start_run

Stub = control_pb2_grpc.ControlServiceStub
INVALID = grpc.StatusCode.INVALID_ARGUMENT
COUNTS = ("runs", "tasks", "attempts", "dispatches", "events")


def prune(older_than: timedelta, **fields: object) -> control_pb2.PruneRunsRequest:
    request = control_pb2.PruneRunsRequest(**fields)  # type: ignore[arg-type]
    request.older_than.FromTimedelta(older_than)
    return request


async def stored(pool: Pool) -> int:
    return len(await backlog.run_ids(pool))


async def test_prune_deletes_past_the_age_a_limit_per_call_and_says_what_is_left(
    control: Stub, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awp.audit")
    made = await backlog.seed(pool, 25, tasks=2, finished_ago_s=8 * 86400)
    await backlog.seed(pool, 3, tasks=2, finished_ago_s=6 * 86400)
    live = await start_run(pool, spec("live", 2))
    week = timedelta(days=7)

    first = await control.PruneRuns(prune(week, limit=10))
    assert (first.runs, first.tasks, first.remaining) == (10, 20, 15)
    now = await pool.fetchval("SELECT clock_timestamp()")
    cutoff = first.cutoff.ToDatetime().replace(tzinfo=now.tzinfo)
    assert timedelta(0) < now - week - cutoff < timedelta(seconds=30)

    rest = await control.PruneRuns(prune(week))
    assert (rest.runs, rest.remaining) == (15, 0)
    rows = sum(getattr(first, name) + getattr(rest, name) for name in COUNTS)
    assert rows == made.rows
    assert await stored(pool) == 3  # the younger ones
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE id = $1", live) == 1

    audit = [r for r in caplog.records if r.name == "awp.audit"]
    assert [(r.call, r.runs, r.remaining) for r in audit] == [  # type: ignore[attr-defined]
        ("PruneRuns", 10, 15),
        ("PruneRuns", 15, 0),
    ]


async def test_a_dry_run_pages_under_one_cutoff_and_deletes_nothing(
    control: Stub, pool: Pool
) -> None:
    made = await backlog.seed(pool, 25, tasks=2, finished_ago_s=8 * 86400)
    request = prune(timedelta(days=7), dry_run=True, limit=10)
    pages = []
    total = dict.fromkeys(COUNTS, 0)
    cutoffs = set()
    while True:
        answer = await control.PruneRuns(request)
        pages.append((answer.runs, answer.remaining))
        cutoffs.add(answer.cutoff.ToDatetime())
        for name in COUNTS:
            total[name] += getattr(answer, name)
        if not answer.next_page_token:
            break
        request.page_token = answer.next_page_token
    assert pages == [(10, 15), (10, 5), (5, 0)]
    assert len(cutoffs) == 1
    assert sum(total.values()) == made.rows
    assert await stored(pool) == 25


async def test_bad_prune_requests_name_their_field(control: Stub) -> None:
    for older_than in (timedelta(0), timedelta(seconds=-5)):
        await expect_error(
            control.PruneRuns(prune(older_than)), INVALID, Reason.INVALID_ARGUMENT, "older_than"
        )
    await expect_error(
        control.PruneRuns(prune(timedelta(days=1), page_token="abc")),
        INVALID,
        Reason.INVALID_ARGUMENT,
        "page_token",
    )
    await expect_error(
        control.PruneRuns(prune(timedelta(days=1), dry_run=True, page_token="not-a-token")),
        INVALID,
        Reason.INVALID_ARGUMENT,
        "page_token",
    )
    await expect_error(
        control.PruneRuns(prune(timedelta(days=1), dry_run=True, page_token="x" * 513)),
        INVALID,
        Reason.INVALID_ARGUMENT,
        "page_token",
    )
