"""An attempt's checkpoints on the wire: the worker's ``CheckpointStore`` (awp_sdk.replay)
over LoadCheckpoints and RecordStep (DESIGN.md §16).

Both are fenced by the server exactly as Complete is. Transient failures are retried
(a resent RecordStep is answered DUPLICATE), for as long as the attempt lives: its
safety deadline or revocation cancels the executor, and ``close`` then cancels the
calls still in flight (a sync action waiting on one gets ``ActionCancelled``). A sync
action's thread outlives its cancelled attempt until it returns to the SDK: a call it
makes then is still sent, once, and judged by the server, which is the one judge of
the lease (no retry). A LEASE_LOST answer stops the attempt as a refused AppendStream
does (``on_lost``), and the action sees ``ActionCancelled``: a stale attempt stores no
memo.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from awp.v1 import types_pb2, worker_pb2
from awp_protocol.errors import Reason
from awp_protocol.jsonvalue import parse_value
from awp_sdk.actions import ActionCancelled, PermanentError
from awp_sdk.replay import KINDS, Checkpoint, Kind, Usage
from awp_worker._backoff import Backoff
from awp_worker._errors import describe, error_reason, is_transient

log = logging.getLogger("awp_worker.checkpoints")

# awp.v1.CheckpointKind <-> the replay core's names.
_KIND_OF: dict[int, Kind] = {
    types_pb2.CheckpointKind.Value(f"CHECKPOINT_KIND_{kind.upper()}"): kind for kind in KINDS
}


class CheckpointsLost(ActionCancelled):
    """The attempt's lease is lost: it may store no memo, and stops."""


def checkpoint_from_proto(message: worker_pb2.Checkpoint) -> Checkpoint:
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
    ) -> None:
        self._lease = lease
        self._call = call
        self._on_lost = on_lost
        self._fields = log_fields
        self._lost: str | None = None
        self._closed = False
        self._calls: set[asyncio.Task[Any]] = set()

    async def load(self) -> Sequence[Checkpoint]:
        found: list[Checkpoint] = []
        page_token = ""
        while True:
            request = worker_pb2.LoadCheckpointsRequest(
                dispatch_id=self._lease.dispatch_id,
                lease_token=self._lease.lease_token,
                page_token=page_token,
            )
            response: worker_pb2.LoadCheckpointsResponse = await self._send(
                "LoadCheckpoints", request
            )
            found.extend(checkpoint_from_proto(c) for c in response.checkpoints)
            page_token = response.next_page_token
            if not page_token:
                return found

    async def record_step(
        self, name: str, occurrence: int, value_json: str, usage: Usage
    ) -> Checkpoint | None:
        request = worker_pb2.RecordStepRequest(
            dispatch_id=self._lease.dispatch_id,
            lease_token=self._lease.lease_token,
            name=name,
            occurrence=occurrence,
            value_json=value_json,
            usage=types_pb2.StepUsage(tokens=usage.tokens, cost_usd=usage.cost_usd),
        )
        response: worker_pb2.RecordStepResponse = await self._send("RecordStep", request)
        outcome = response.outcome
        if outcome in (worker_pb2.COMPLETE_OUTCOME_ACCEPTED, worker_pb2.COMPLETE_OUTCOME_DUPLICATE):
            return None
        if outcome == worker_pb2.COMPLETE_OUTCOME_RESULT_CONFLICT:
            # Another value is stored under this step: a memo never changes, so it is
            # the step's result.
            for stored in await self.load():
                if (stored.kind, stored.name, stored.occurrence) == ("step", name, occurrence):
                    return stored
            raise RuntimeError(f"RecordStep answered RESULT_CONFLICT for step {name!r} it lacks")
        self._lose("RecordStep: lease lost")
        raise CheckpointsLost(f"step {name!r} of attempt {self._lease.attempt}: lease lost")

    def close(self) -> None:
        """The attempt is over: calls still in flight end (their waiters see
        ``ActionCancelled``)."""
        self._closed = True
        for task in list(self._calls):
            task.cancel()

    # --- internals ----------------------------------------------------------------

    async def _send(self, method: str, request: Any) -> Any:
        if self._lost is not None:
            raise CheckpointsLost(self._lost)
        task = asyncio.ensure_future(self._retrying(method, request))
        self._calls.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if task.cancelled() and not _cancelling():
                raise CheckpointsLost(f"{method}: the attempt ended") from None
            raise
        finally:
            self._calls.discard(task)

    async def _retrying(self, method: str, request: Any) -> Any:
        backoff = Backoff(0.05, 2.0)
        while True:
            try:
                return await self._call(method, request)
            except grpc.RpcError as exc:
                if error_reason(exc) == Reason.LEASE_LOST:
                    self._lose(f"{method}: lease lost")
                    raise CheckpointsLost(f"{method}: lease lost") from None
                if error_reason(exc) == Reason.MEMO_LIMIT:
                    # Past a limit of the task's memos: every retry would be too.
                    raise PermanentError(exc.details() or "MEMO_LIMIT") from None
                if not is_transient(exc):
                    raise
                if self._closed:
                    raise CheckpointsLost(f"{method}: the attempt ended") from None
                log.info("%s failed (%s); resending", method, describe(exc), extra=self._fields)
                await asyncio.sleep(backoff.next())

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            log.warning("checkpoints refused: %s", reason, extra=self._fields)
            self._on_lost(reason)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
