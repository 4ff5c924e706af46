"""WorkerRuntime against a scriptable in-memory WorkerService (worker_fakes): heartbeats,
claims and Completes under faults that a real server cannot be made to produce on cue."""

from __future__ import annotations

import grpc
import pytest
from runtime_harness import UNAVAILABLE, start
from worker_fakes import FakeServer, Fault

from awp.v1 import types_pb2, worker_pb2
from awp_worker._lease import STOOD_DOWN, StandDown
from awp_worker._lifecycle import EXIT_OK, EXIT_SESSION_LOST
from kit import poll_until as eventually


def stood_down(caplog: pytest.LogCaptureFixture) -> list[object]:
    """The stood_down field of every line logged: each way of giving a lease up says so."""
    return [getattr(r, STOOD_DOWN) for r in caplog.records if hasattr(r, STOOD_DOWN)]


# --- Heartbeat ------------------------------------------------------------------------


async def test_idle_workers_heartbeat_every_interval(fake: FakeServer) -> None:
    worker = start(fake)
    await worker.registered()
    await eventually(lambda: len(fake.service.heartbeats) >= 3)
    assert all(not hb.leases for hb in fake.service.heartbeats)
    assert fake.service.streams_opened == 1  # one stream for the whole session
    assert await worker.stop() == EXIT_OK


async def test_heartbeats_list_held_leases_and_renewals_extend_the_deadline(
    fake: FakeServer,
) -> None:
    service = fake.service
    # The lease lasts 0.5 s unless renewed; the task takes 1.5 s.
    task = await service.add("slow", {"sleep_ms": 1500}, lease_s=0.5)
    worker = start(fake)
    await eventually(lambda: task.dispatch_id in service.results())
    assert await worker.stop() == EXIT_OK
    assert service.results()[task.dispatch_id].outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
    listed = [hb for hb in service.heartbeats if hb.leases]
    assert listed and all(
        [(r.dispatch_id, r.lease_token) for r in hb.leases] == [(task.dispatch_id, task.token)]
        for hb in listed
    )
    assert worker.runtime.metrics.safety_cancellations._value.get() == 0


async def test_a_broken_stream_is_reopened_at_once_and_leases_resent(fake: FakeServer) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 1500})
    # Long interval: only a reconnect (not the timer) can send the leases again soon.
    service.heartbeat_interval = 30.0
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    sent = len(service.heartbeats)
    service.break_streams()
    await eventually(lambda: service.streams_opened >= 2, within=1.0)
    await eventually(lambda: len(service.heartbeats) > sent, within=1.0)
    assert [r.dispatch_id for r in service.heartbeats[-1].leases] == [task.dispatch_id]
    assert worker.runtime.metrics.heartbeat_reconnects._value.get() >= 1
    assert await worker.stop() == EXIT_OK


async def test_revoked_leases_are_cancelled_and_not_reported(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    service = fake.service
    task = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    service.revoke(task)
    await eventually(lambda: worker.runtime.held_leases == 0)
    assert worker.runtime.metrics.revocations.labels("revoked")._value.get() == 1
    assert stood_down(caplog) == [StandDown.REVOKED]
    # The lease is dropped first; the cancelled executor is counted once it has unwound.
    cancelled = worker.runtime.metrics.executions.labels("mock", "cancelled")
    await eventually(lambda: cancelled._value.get() == 1)
    assert not service.completes, "a revoked lease reported a result"
    assert await worker.stop() == EXIT_OK
    assert not service.completes  # nothing reported


async def test_a_pushed_revocation_cancels_at_once(fake: FakeServer) -> None:
    """The server speaks first (worker.proto, Heartbeat): with a 30 s heartbeat, only
    the unprompted answer can stop the lease this soon."""
    service = fake.service
    service.heartbeat_interval = 30.0
    task = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    service.revoke(task)
    service.push_revoked(task.dispatch_id)
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    cancelled = worker.runtime.metrics.executions.labels("mock", "cancelled")
    await eventually(lambda: cancelled._value.get() == 1, within=5.0)
    assert worker.runtime.metrics.revocations.labels("revoked")._value.get() == 1
    assert await worker.stop() == EXIT_OK
    assert not service.completes


async def test_a_revocation_that_overtakes_its_lease_keeps_it_from_running(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A push can arrive before the Claim answer carrying the lease: the worker keeps
    it, and never runs the lease when it comes."""
    service = fake.service
    service.heartbeat_interval = 30.0
    held = await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    early = await service.add("slow", {"sleep_ms": 30_000}, state="parked")
    service.push_revoked(early.dispatch_id)
    service.revoke(held)
    service.push_revoked(held.dispatch_id)
    # Pushes are read in order: once the second one is handled, so was the first.
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    await service.offer(early)
    await eventually(lambda: early.state == "leased")
    revoked = worker.runtime.metrics.revocations.labels("revoked")
    await eventually(lambda: revoked._value.get() == 2)
    assert stood_down(caplog) == [StandDown.REVOKED, StandDown.REVOKED]
    assert worker.runtime.held_leases == 0
    metrics = worker.runtime.metrics
    assert metrics.executions.labels("mock", "cancelled")._value.get() == 1  # `held` only
    assert metrics.executions.labels("mock", "succeeded")._value.get() == 0
    assert await worker.stop() == EXIT_OK
    assert not service.completes


async def test_the_safety_deadline_cancels_work_without_ownership(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    service = fake.service
    # Heartbeats answer without extending the lease: it runs out after 0.6 s.
    task = await service.add("slow", {"sleep_ms": 30_000}, lease_s=0.6, renew="silent")
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    metrics = worker.runtime.metrics
    assert metrics.safety_cancellations._value.get() == 1
    assert stood_down(caplog) == [StandDown.SAFETY_DEADLINE]
    assert metrics.executions.labels("mock", "safety_deadline")._value.get() == 1
    assert task.dispatch_id not in service.results()
    assert await worker.stop() == EXIT_OK
    # Given up locally, handed back in the final Drain so it is retried at once.
    assert [r.dispatch_id for r in service.drains[-1].hand_back] == [task.dispatch_id]


async def test_renewals_never_extend_past_the_attempt_deadline(fake: FakeServer) -> None:
    service = fake.service
    # Renewed generously, but the attempt itself ends after 0.8 s.
    task = await service.add("slow", {"sleep_ms": 30_000}, lease_s=10.0, attempt_s=0.8)
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    await eventually(lambda: worker.runtime.held_leases == 0, within=5.0)
    assert worker.runtime.metrics.safety_cancellations._value.get() == 1
    assert task.dispatch_id not in service.results()
    assert await worker.stop() == EXIT_OK


async def test_session_invalid_on_the_stream_is_permanent(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    service = fake.service
    await service.add("slow", {"sleep_ms": 30_000})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    service.fail("Heartbeat", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    assert await worker.exit_code() == EXIT_SESSION_LOST
    assert stood_down(caplog) == [StandDown.SESSION_LOST]
    assert worker.runtime.metrics.executions.labels("mock", "cancelled")._value.get() == 1
    assert not service.completes


async def test_an_offline_session_is_permanent(fake: FakeServer) -> None:
    worker = start(fake)
    await worker.registered()
    fake.service.forced_session_state = types_pb2.WORKER_STATE_OFFLINE
    assert await worker.exit_code() == EXIT_SESSION_LOST


# --- Claim ----------------------------------------------------------------------------


async def test_claims_never_exceed_free_slots(fake: FakeServer) -> None:
    service = fake.service
    for _ in range(7):
        await service.add("slow", {"sleep_ms": 100})
    worker = start(fake, concurrency=2)
    await eventually(lambda: len(service.results()) == 7)
    assert await worker.stop() == EXIT_OK
    assert all(c.max_leases <= 2 for c in service.claims)
    assert max(c.max_leases for c in service.claims) == 2


async def test_claim_errors_back_off_and_recover(fake: FakeServer) -> None:
    service = fake.service
    service.fail("Claim", UNAVAILABLE, UNAVAILABLE, Fault(grpc.StatusCode.INTERNAL))
    await service.add("x")
    worker = start(fake)
    await eventually(lambda: len(service.results()) == 1)
    assert worker.runtime.metrics.claims.labels("error")._value.get() == 3
    assert await worker.stop() == EXIT_OK


async def test_a_server_side_drain_stops_claiming_and_exits(fake: FakeServer) -> None:
    worker = start(fake)
    worker_id = await worker.registered()
    fake.service.sessions[worker_id] = "draining"
    assert await worker.exit_code() == EXIT_OK
    assert fake.service.sessions[worker_id] == "stopped"


async def test_session_invalid_on_claim_is_permanent(fake: FakeServer) -> None:
    fake.service.fail("Claim", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    assert await start(fake).exit_code() == EXIT_SESSION_LOST


# --- Complete -------------------------------------------------------------------------


async def test_a_lost_complete_answer_is_retried_with_the_same_result(fake: FakeServer) -> None:
    service = fake.service
    service.fail("Complete", Fault(grpc.StatusCode.UNAVAILABLE, after=True))
    task = await service.add("x", {"v": 1})
    worker = start(fake)
    await eventually(lambda: len(service.completes) >= 2)
    await eventually(lambda: worker.runtime.held_leases == 0)
    first, second = service.completes[0], service.completes[1]
    assert list(first.results) == list(second.results)
    assert first.results[0].lease_token == task.token
    metrics = worker.runtime.metrics
    assert metrics.completes.labels("duplicate")._value.get() == 1
    assert await worker.stop() == EXIT_OK


async def test_lease_lost_answers_are_dropped(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    service = fake.service
    task = await service.add("x", {"sleep_ms": 200})
    worker = start(fake)
    await eventually(lambda: worker.runtime.held_leases == 1)
    task.token = "rotated"  # the server no longer recognises the worker's lease
    await eventually(lambda: worker.runtime.held_leases == 0)
    metrics = worker.runtime.metrics
    # The heartbeat (UNKNOWN) or the Complete (LEASE_LOST) notices, or both when the
    # result was already on its way as the heartbeat answered; never is it accepted.
    assert (
        metrics.completes.labels("lease_lost")._value.get()
        + metrics.revocations.labels("unknown")._value.get()
        >= 1
    )
    assert set(stood_down(caplog)) <= {StandDown.LEASE_LOST, StandDown.REVOKED}
    assert stood_down(caplog)
    assert metrics.completes.labels("accepted")._value.get() == 0
    assert await worker.stop() == EXIT_OK


async def test_session_invalid_on_complete_is_permanent(fake: FakeServer) -> None:
    fake.service.fail("Complete", Fault(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID"))
    await fake.service.add("x")
    assert await start(fake).exit_code() == EXIT_SESSION_LOST
