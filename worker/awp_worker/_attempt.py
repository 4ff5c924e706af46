"""One lease's attempt: from the lease a Claim returned to a result for the flusher.

A claimed lease becomes a ``HeldLease`` (its local deadlines, the action's context,
its log fields) and one executor task under the supervisor. The executor runs inside
a timeout at the lease's local safety deadline, which renewals move
(``HeldLease.reschedule``); past it the worker may no longer own the lease, so the
work is cancelled and nothing is reported: the lease is given up, and handed back in
the last Drain. A result goes to the flusher unless the lease was revoked meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from awp.v1 import types_pb2, worker_pb2
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import struct_to_dict
from awp_protocol.states import task_state_name
from awp_sdk.actions import ActionContext, output_struct
from awp_sdk.replay import Replay
from awp_sdk.waits import WaitSpec
from awp_worker import _tracing
from awp_worker._checkpoints import LeaseCheckpoints
from awp_worker._completer import DROPPED, ResultFlusher
from awp_worker._diagnostics import LogTail, collecting
from awp_worker._errors import Kind, classify, describe, error_reason
from awp_worker._executors import (
    Executor,
    failure,
    failure_from_exception,
    success,
    with_reports,
)
from awp_worker._lease import STOOD_DOWN, HeldLease, LeaseClock, Phase, StandDown, seconds
from awp_worker._logging import LeaseLog, bind
from awp_worker._owner import Owner
from awp_worker._stream import StreamSettings, StreamWriter
from awp_worker._supervisor import Supervisor

log = logging.getLogger("awp_worker.attempt")


class Attempts:
    def __init__(
        self,
        owner: Owner,
        executors: Mapping[str, Executor],
        flusher: ResultFlusher,
        supervisor: Supervisor,
    ) -> None:
        self._owner = owner
        self._executors = executors
        self._flusher = flusher
        self._supervisor = supervisor

    def start(self, leases: Sequence[worker_pb2.Lease]) -> None:
        """Hold each claimed lease and start executing it."""
        owner = self._owner
        now = asyncio.get_running_loop().time()
        for lease in leases:
            owner.metrics.claimed_leases.inc()
            if owner.leases.get(lease.dispatch_id) is not None:
                log.error(
                    "Claim returned dispatch %d twice; ignoring the repeat", lease.dispatch_id
                )
                continue
            held = self._hold(lease, now)
            status = owner.leases.take_early_revocation(lease.dispatch_id)
            if status is not None:
                # Revoked (a pushed REVOKED) before the Claim answer arrived: never run it.
                owner.metrics.revocations.labels(status).inc()
                LeaseLog(log, held.log_fields).warning(
                    "lease %s by the server before it arrived: not running it",
                    status,
                    extra={STOOD_DOWN: StandDown.REVOKED},
                )
                continue
            owner.leases.add(held)
            held.task = self._supervisor.spawn(self._execute(held), f"lease-{lease.dispatch_id}")
        owner.metrics.leases_held.set(len(owner.leases))

    def _hold(self, lease: worker_pb2.Lease, now: float) -> HeldLease:
        session = self._owner.session
        lease_remaining = (
            seconds(lease.lease_remaining)
            if lease.HasField("lease_remaining")
            else session.lease_ttl
        )
        attempt_remaining = (
            seconds(lease.attempt_remaining) if lease.HasField("attempt_remaining") else math.inf
        )
        clock = LeaseClock.start(
            now, lease_remaining, attempt_remaining, self._owner.config.safety_margin
        )
        fields: dict[str, Any] = {
            "run_id": lease.run_id,
            "task_key": lease.task_key,
            "attempt": lease.attempt,
            "worker_id": session.worker_id,
            "dispatch_id": lease.dispatch_id,
            "action": lease.action,
        }
        holding: list[HeldLease] = []
        checkpoints = LeaseCheckpoints(
            lease,
            session.lease_call,
            lambda reason: self._memo_lost(holding[0], reason),
            fields,
            lambda spec: self._suspended(holding[0], spec),
        )
        stream = StreamWriter(
            lease,
            session.append_stream,
            lambda reason: self._stream_lost(holding[0], reason),
            StreamSettings(),
            fields,
        )
        ctx = ActionContext(
            run_id=lease.run_id,
            task_key=lease.task_key,
            action=lease.action,
            attempt=lease.attempt,
            max_attempts=lease.max_attempts,
            idempotency_key=lease.idempotency_key,
            fencing_token=lease.fencing_token,
            deadline=clock.attempt_safety_deadline,
            worker_id=session.worker_id or "",
            run_input=struct_to_dict(lease.run_input),
            upstream={key: struct_to_dict(out) for key, out in lease.upstream_outputs.items()},
            upstream_states={
                key: task_state_name(state) for key, state in lease.upstream_states.items()
            },
            stream=stream,
            replay=Replay(checkpoints, asyncio.get_running_loop()),
        )
        held = HeldLease(
            lease=lease,
            clock=clock,
            ctx=ctx,
            log_fields=fields,
            stream=stream,
            checkpoints=checkpoints,
        )
        holding.append(held)
        return held

    def _stream_lost(self, held: HeldLease, reason: str) -> None:
        """An append or a memo was refused (LEASE_LOST): the attempt stops as if its
        lease were revoked."""
        if self._owner.leases.holds(held):
            revoke(self._owner, held, "lost")

    def _suspended(self, held: HeldLease, spec: WaitSpec) -> None:
        """The attempt ended SUSPENDED at a wait (the server ended its lease): stop it,
        report nothing, free the slot."""
        _tracing.suspended(held, spec)
        if self._owner.leases.holds(held):
            self._owner.leases.release(held)
            held.cancel("suspended")

    def _memo_lost(self, held: HeldLease, reason: str) -> None:
        self._owner.metrics.memos_refused.inc()
        self._stream_lost(held, reason)

    async def _execute(self, held: HeldLease) -> None:
        bind(**held.log_fields)  # this task's context only: user log lines carry them too
        worker_id = self._owner.session.worker_id or ""
        with _tracing.attempt(held, worker_id, lambda: self._owner.leases.holds(held)):
            await self._execute_traced(held)

    async def _execute_traced(self, held: HeldLease) -> None:
        metrics = self._owner.metrics
        lease = held.lease
        kind = lease.executor_kind
        lease_log = LeaseLog(log, held.log_fields)
        executor = self._executors.get(kind)
        started = time.monotonic()
        lease_log.debug("executing %s (%s)", lease.action, kind)
        try:
            result: worker_pb2.TaskResult | None
            if executor is None:
                message = f"this worker has no executor for kind {kind!r}"
                lease_log.warning("failed (permanent): %s", message)
                result = failure(lease, message, retryable=False)
            else:
                result = await self._run_executor(held, executor, lease_log)
            if result is not None and not await self._flush_stream(held, lease_log):
                result = None
        except asyncio.CancelledError:
            held.ctx._cancel()
            held.outcome = "cancelled"
            metrics.executions.labels(kind, held.outcome).inc()
            lease_log.info("execution cancelled (%s)", held.cancel_reason or "worker stopping")
            raise
        finally:
            held.timeout = None
            if held.stream is not None:
                held.stream.close()
            if held.checkpoints is not None:
                held.checkpoints.close()
            metrics.execution_seconds.labels(kind).observe(time.monotonic() - started)
        if result is None:
            held.outcome = "safety_deadline"
            metrics.executions.labels(kind, held.outcome).inc()
            self._owner.leases.abandon(held)
            return
        succeeded = result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED
        held.outcome = "succeeded" if succeeded else "failed"
        metrics.executions.labels(kind, held.outcome).inc()
        self._report(held, with_reports(result, held.ctx), lease_log)

    async def _run_executor(
        self, held: HeldLease, executor: Executor, lease_log: LeaseLog
    ) -> worker_pb2.TaskResult | None:
        """The attempt's result, or None if the local safety deadline cut it off."""
        lease = held.lease
        tail = LogTail()
        try:
            async with asyncio.timeout_at(held.clock.safety_deadline) as timeout:
                held.timeout = timeout
                with collecting(tail):
                    if lease.omitted_upstream_keys and not await self._fetch_upstream(
                        held, lease_log
                    ):
                        return None
                    with _tracing.action(held):
                        output = await executor.execute(held.ctx, struct_to_dict(lease.input))
            if timeout.expired():  # the action swallowed the cancellation and returned
                self._safety_deadline_passed(held, lease_log)
                return None
            return success(lease, output_struct(output))
        except TimeoutError as exc:
            if held.timeout is not None and held.timeout.expired():
                self._safety_deadline_passed(held, lease_log)
                return None
            return _failed(lease, exc, tail, lease_log)  # the action's own timeout
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or held.cancel_reason is not None:
                raise
            # The action raised CancelledError by itself (nobody cancelled this task).
            lease_log.warning("failed (retryable): the action raised CancelledError")
            return failure(
                lease, "the action raised CancelledError", retryable=True, log_tail=tail.text()
            )
        except Exception as exc:
            return _failed(lease, exc, tail, lease_log)

    async def _flush_stream(self, held: HeldLease, lease_log: LeaseLog) -> bool:
        """Every chunk the action wrote is stored before its result is reported (a
        reader sees the attempt's whole stream before its end); False if the safety
        deadline passed first. A lost lease cancels this task (_stream_lost)."""
        if held.stream is None:
            return True
        try:
            async with asyncio.timeout_at(held.clock.safety_deadline):
                await held.stream.flush()
        except TimeoutError:
            self._safety_deadline_passed(held, lease_log)
            return False
        return True

    async def _fetch_upstream(self, held: HeldLease, lease_log: LeaseLog) -> bool:
        """Adds the upstream outputs the lease left out (to keep the Claim answer
        deliverable) to the action's context; False if the lease is gone meanwhile."""
        try:
            held.ctx.upstream.update(await self._owner.session.upstream_outputs(held.lease))
        except grpc.RpcError as exc:
            if error_reason(exc) != Reason.LEASE_LOST and classify(exc) is not Kind.PERMANENT:
                raise
            lease_log.warning(
                "lease lost before the action started (%s)",
                describe(exc),
                extra={STOOD_DOWN: StandDown.LEASE_LOST},
            )
            return False
        return True

    def _safety_deadline_passed(self, held: HeldLease, lease_log: LeaseLog) -> None:
        held.ctx._cancel()
        self._owner.metrics.safety_cancellations.inc()
        lease_log.warning(
            "safety deadline passed (the lease could no longer be confirmed): "
            "execution cancelled, nothing reported",
            extra={STOOD_DOWN: StandDown.SAFETY_DEADLINE},
        )

    def _report(self, held: HeldLease, result: worker_pb2.TaskResult, lease_log: LeaseLog) -> None:
        if result.outcome == worker_pb2.RESULT_OUTCOME_SUCCEEDED:
            lease_log.debug("succeeded")
        if not self._owner.leases.holds(held):
            # Revoked while the action ran: the server no longer wants this result.
            self._owner.metrics.completes.labels(DROPPED).inc()
            return
        if held.ctx.replay is not None:
            saved = held.ctx.replay.savings
            result.replayed.CopyFrom(
                types_pb2.MemoSavings(
                    steps=saved.steps, tokens=saved.tokens, cost_usd=saved.cost_usd
                )
            )
        held.result = result
        held.phase = Phase.REPORTING
        self._flusher.submit(held)


def _failed(
    lease: worker_pb2.Lease, exc: Exception, tail: LogTail, lease_log: LeaseLog
) -> worker_pb2.TaskResult:
    """The failure an exception stands for; its log line carries the whole traceback."""
    result = failure_from_exception(lease, exc, tail.text())
    lease_log.warning(
        "failed (%s): %s",
        "retryable" if result.error.retryable else "permanent",
        result.error.message,
        exc_info=exc,
    )
    return result


def revoke(owner: Owner, held: HeldLease, status: str) -> None:
    """The server no longer counts ``held`` as this session's: stop it, report nothing."""
    checkpoints = held.checkpoints
    if checkpoints is not None and checkpoints.defer_revocation(
        lambda: revoke(owner, held, status)
    ):
        return
    owner.metrics.revocations.labels(status).inc()
    LeaseLog(log, held.log_fields).warning(
        "lease %s by the server (%s): stopping it, reporting nothing",
        status,
        held.phase.value,
        extra={STOOD_DOWN: StandDown.REVOKED},
    )
    _tracing.revoked(held, status)
    owner.leases.release(held)
    held.cancel("revoked")
