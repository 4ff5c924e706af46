"""Fixtures of the fault suite: a cluster of real processes per test, its logs attached to
every failure report, and recovery figures gathered into the terminal summary."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cluster import Cluster, Timings
from figures import FIGURES
from report import log_tails, snapshot

from awp_db.connect import connect
from awp_db.embedded import EmbeddedPostgres
from awp_db.migrate import migrate

CLUSTERS = pytest.StashKey[list[Cluster]]()
FAILED_REPORT = pytest.StashKey[pytest.TestReport]()
CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_REPORT] = report
    if report.failed:
        item.stash[FAILED_REPORT] = report
        # The processes' own words are the first thing a failure needs.
        for cluster in item.stash.get(CLUSTERS, []):
            for name, tail in log_tails(cluster):
                report.sections.append((f"awp log tail: {name} ({report.when})", tail))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("awp fault figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@contextlib.asynccontextmanager
async def _running(request: pytest.FixtureRequest, cluster: Cluster) -> AsyncIterator[Cluster]:
    """Registers the cluster with the test's report; after a failure, adds the database's
    view to the report before tearing down."""
    cluster.label = request.node.name
    cluster.dir.mkdir()
    request.node.stash[CLUSTERS] = [*request.node.stash.get(CLUSTERS, []), cluster]
    try:
        yield cluster
    finally:
        failed = request.node.stash.get(FAILED_REPORT, None)
        if failed is not None:
            failed.sections.append(("awp database snapshot", await snapshot(cluster)))
        await cluster.close()
        call = request.node.stash.get(CALL_REPORT, None)
        if call is not None and call.passed and not cluster.invariants_checked:
            pytest.fail("the scenario passed without running the invariant check (DESIGN.md §10)")


@pytest.fixture
async def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, database_dsn: str
) -> AsyncIterator[Cluster]:
    """Processes against this test's fresh database on the session's PostgreSQL."""
    async with _running(request, Cluster(tmp_path / "cluster", database_dsn)) as running:
        yield running


@pytest.fixture
async def slow_heartbeat(
    request: pytest.FixtureRequest, tmp_path: Path, database_dsn: str
) -> AsyncIterator[Cluster]:
    """As `cluster`, with a 30 s heartbeat: what a test sees sooner, no heartbeat did."""
    timings = replace(Timings(), heartbeat_s=30.0, lease_ttl_s=90.0, offline_after_s=120.0)
    cluster = Cluster(tmp_path / "cluster", database_dsn, timings=timings)
    async with _running(request, cluster) as running:
        yield running


@pytest.fixture
async def patient_sessions(
    request: pytest.FixtureRequest, tmp_path: Path, database_dsn: str
) -> AsyncIterator[Cluster]:
    """As `cluster`, with sessions marked offline only after 60 s of silence: a worker
    frozen for longer than its leases (which still expire after 2 s) keeps its session,
    so what it sends once thawed is judged by the lease rule alone."""
    timings = replace(Timings(), offline_after_s=60.0)
    cluster = Cluster(tmp_path / "cluster", database_dsn, timings=timings)
    async with _running(request, cluster) as running:
        yield running


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, for scenarios that stop it (others are untouched).

    Not unsafe_fast: with synchronous_commit=off an immediate stop loses the last
    commits (a worker's registration, say), which no real outage of a durable database
    does. fsync and full-page writes stay off: they only matter if the OS crashes.

    Its data lives outside pytest's temporary root, as the session's PostgreSQL does:
    the server runs as another user, which must traverse the path, and any pytest
    session that starts meanwhile takes that right away from /tmp/pytest-of-<user>
    (a restart in an outage scenario then failed with "Permission denied").
    """
    root = Path(tempfile.mkdtemp(prefix="awp-fault-pg-"))
    server = EmbeddedPostgres(
        root / "pg", extra_settings=("fsync=off", "full_page_writes=off")
    ).start()
    try:
        yield server
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def pg_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, own_postgres: EmbeddedPostgres
) -> AsyncIterator[Cluster]:
    """Processes against a PostgreSQL the test may stop and start (cluster.postgres)."""
    conn = await connect(own_postgres.dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    cluster = Cluster(tmp_path / "cluster", own_postgres.dsn, postgres=own_postgres)
    async with _running(request, cluster) as running:
        yield running
