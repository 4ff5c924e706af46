"""An attempt's checkpoints on the wire: the worker's ``CheckpointStore`` (awp_sdk.replay)
over LoadCheckpoints, RecordStep and Await (DESIGN.md §16). An Await answered
SUSPENDED ends the attempt without a result (``on_suspended``: the slot is freed).

Both are fenced by the server exactly as Complete is. Transient failures are retried
(a resent RecordStep is answered DUPLICATE) while the attempt lives; an async action's
call ends with its cancelled attempt. A sync action's thread outlives its cancelled
attempt until it returns to the SDK: a call it makes then (``close`` was called) is sent
but not resent, and judged by the server, the one judge of the lease. A LEASE_LOST
answer (or a session the server no longer knows) stops the attempt as a refused
AppendStream does (``on_lost``), and the action sees ``ActionCancelled``: a stale
attempt stores no memo.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from awp.v1 import checkpoints_pb2, session_pb2, types_pb2, worker_pb2
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import parse_value
from awp_sdk.actions import ActionCancelled, PermanentError
from awp_sdk.replay import KINDS, Checkpoint, Kind, Savings, Usage
from awp_sdk.waits import WaitSpec
from awp_worker import _errors
from awp_worker._backoff import Backoff
from awp_worker._errors import classify, describe, error_reason

log = logging.getLogger("awp_worker.checkpoints")

# awp.v1.CheckpointKind <-> the replay core's names.
_KIND_OF: dict[int, Kind] = {
    types_pb2.CheckpointKind.Value(f"CHECKPOINT_KIND_{kind.upper()}"): kind for kind in KINDS
}


class CheckpointsLost(ActionCancelled):
    """The attempt's lease is lost: it may store no memo, and stops."""


def checkpoint_from_proto(message: checkpoints_pb2.Checkpoint) -> Checkpoint:
    """A checkpoint as LoadCheckpoints (or Await) sends it."""
    kind = _KIND_OF.get(message.kind)
    if kind is None:
        raise RuntimeError(f"the server sent a checkpoint of unknown kind {message.kind}")
    return Checkpoint(
        kind=kind,
        name=message.name,
        occurrence=message.occurrence,
        value=parse_value(message.value_json) if message.value_json else None,
        usage=Usage(message.usage.tokens, message.usage.cost_usd),
        timed_out=message.timed_out,
        attempt=message.attempt,
    )


# One call of the session under the lease (Session.lease_call): the session filled in.
LeaseCall = Callable[[str, Any], Awaitable[Any]]


class LeaseCheckpoints:
    """The CheckpointStore of one attempt."""

    def __init__(
        self,
        lease: worker_pb2.Lease,
        call: LeaseCall,
        on_lost: Callable[[str], None],
        log_fields: dict[str, Any],
        on_suspended: Callable[[WaitSpec], None] = lambda spec: None,
    ) -> None:
        self._lease = lease
        self._call = call
        self._on_lost = on_lost
        self._on_suspended = on_suspended
        self._fields = log_fields
        self._lost: str | None = None
        self._closed = False
        # An Await in flight, and a revocation that arrived meanwhile (applied once the
        # answer is known: see defer_revocation).
        self._awaiting = False
        self._deferred: Callable[[], None] | None = None

    def defer_revocation(self, apply: Callable[[], None]) -> bool:
        """Whether a revocation of this lease must wait for the Await in flight.

        A SUSPENDED Await ends its lease in the same transaction, so the heartbeat
        stream's REVOKED for it can overtake the Await's own answer: the attempt then
        read as revoked (and counted and logged so) when it had suspended. While an Await
        is in flight the revocation is held; a SUSPENDED answer drops it (it was the
        suspension's), any other end applies it.
        """
        if not self._awaiting:
            return False
        self._deferred = apply
        return True

    async def load(self) -> Sequence[Checkpoint]:
        found: list[Checkpoint] = []
        page_token = ""
        while True:
            request = checkpoints_pb2.LoadCheckpointsRequest(
                dispatch_id=self._lease.dispatch_id,
                lease_token=self._lease.lease_token,
                page_token=page_token,
            )
            response: checkpoints_pb2.LoadCheckpointsResponse = await self._send(
                "LoadCheckpoints", request
            )
            found.extend(checkpoint_from_proto(c) for c in response.checkpoints)
            page_token = response.next_page_token
            if not page_token:
                return found

    async def record_step(
        self, name: str, occurrence: int, value_json: str, usage: Usage
    ) -> Checkpoint | None:
        request = checkpoints_pb2.RecordStepRequest(
            dispatch_id=self._lease.dispatch_id,
            lease_token=self._lease.lease_token,
            name=name,
            occurrence=occurrence,
            value_json=value_json,
            usage=types_pb2.StepUsage(tokens=usage.tokens, cost_usd=usage.cost_usd),
        )
        response: checkpoints_pb2.RecordStepResponse = await self._send("RecordStep", request)
        outcome = response.outcome
        if outcome in (
            session_pb2.COMPLETE_OUTCOME_ACCEPTED,
            session_pb2.COMPLETE_OUTCOME_DUPLICATE,
        ):
            return None
        if outcome == session_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT:
            # Another value is stored under this step: a memo never changes, so it is
            # the step's result.
            for stored in await self.load():
                if (stored.kind, stored.name, stored.occurrence) == ("step", name, occurrence):
                    return stored
            raise RuntimeError(f"RecordStep answered RESULT_CONFLICT for step {name!r} it lacks")
        self._lose("RecordStep: lease lost")
        raise CheckpointsLost(f"step {name!r} of attempt {self._lease.attempt}: lease lost")

    async def await_wait(self, spec: WaitSpec, replayed: Savings) -> Checkpoint | None:
        request = checkpoints_pb2.AwaitRequest(
            dispatch_id=self._lease.dispatch_id,
            lease_token=self._lease.lease_token,
            kind=types_pb2.CheckpointKind.Value(f"CHECKPOINT_KIND_{spec.kind.upper()}"),
            name=spec.name,
            occurrence=spec.occurrence,
            prompt=spec.prompt,
            role=spec.role,
            replayed=types_pb2.MemoSavings(
                steps=replayed.steps, tokens=replayed.tokens, cost_usd=replayed.cost_usd
            ),
        )
        if spec.sleep_ms is not None:
            request.sleep.FromMilliseconds(spec.sleep_ms)
        if spec.timeout_ms is not None:
            request.timeout.FromMilliseconds(spec.timeout_ms)
        self._awaiting = True
        try:
            response: checkpoints_pb2.AwaitResponse = await self._send("Await", request)
        except BaseException:
            self._await_answered(suspended=False)
            raise
        self._await_answered(suspended=response.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED)
        if response.outcome == checkpoints_pb2.AWAIT_OUTCOME_SATISFIED:
            return checkpoint_from_proto(response.checkpoint)
        if response.outcome == checkpoints_pb2.AWAIT_OUTCOME_SUSPENDED:
            # The lease ended with the attempt: free the slot, report nothing.
            log.info("suspended at the %s wait %r", spec.kind, spec.name, extra=self._fields)
            self._lost = f"suspended at the {spec.kind} wait {spec.name!r}"
            self._on_suspended(spec)
            return None
        self._lose("Await: lease lost")
        raise CheckpointsLost(f"wait {spec.name!r} of attempt {self._lease.attempt}: lease lost")

    def _await_answered(self, *, suspended: bool) -> None:
        self._awaiting = False
        deferred, self._deferred = self._deferred, None
        if deferred is not None and not suspended:
            deferred()

    def close(self) -> None:
        """The attempt is over: a call in flight or made later is not resent."""
        self._closed = True

    # --- internals ----------------------------------------------------------------

    async def _send(self, method: str, request: Any) -> Any:
        if self._lost is not None:
            raise CheckpointsLost(self._lost)
        return await self._retrying(method, request)

    async def _retrying(self, method: str, request: Any) -> Any:
        backoff = Backoff(0.05, 2.0)
        while True:
            try:
                return await self._call(method, request)
            except grpc.RpcError as exc:
                kind = classify(exc)
                if error_reason(exc) == Reason.LEASE_LOST or kind is _errors.Kind.PERMANENT:
                    # The lease, or the whole session, is gone: stop, report nothing.
                    self._lose(f"{method}: {describe(exc)}")
                    raise CheckpointsLost(f"{method}: {describe(exc)}") from None
                if kind is _errors.Kind.REJECTED:
                    # Past a memo limit, or a memo the server refuses as sent: every
                    # retry would be too.
                    raise PermanentError(f"{method} refused: {describe(exc)}") from None
                if self._closed:
                    log.info(
                        "%s failed (%s) after the attempt ended: not resent",
                        method,
                        describe(exc),
                        extra=self._fields,
                    )
                    raise CheckpointsLost(f"{method}: the attempt ended") from None
                log.info("%s failed (%s); resending", method, describe(exc), extra=self._fields)
                await asyncio.sleep(backoff.next())

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            log.warning("checkpoints refused: %s", reason, extra=self._fields)
            self._on_lost(reason)
