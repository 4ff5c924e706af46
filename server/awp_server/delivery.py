"""Answers every client can receive: nothing the server sends grows past
MAX_RESPONSE_BYTES (awp_protocol.limits), whatever the run's size (DESIGN.md §4 "Sizes").

Leases and GetRun answers carry outputs while the budget lasts and name what they leave
out; GetUpstreamOutputs and GetTaskOutput deliver the rest one budget at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from uuid import UUID

from google.protobuf import struct_pb2

from awp.v1 import runs_pb2, worker_pb2
from awp_db import claims
from awp_protocol.jsonvalue import dict_to_struct
from awp_protocol.limits import MAX_RESPONSE_BYTES
from awp_server import spans
from awp_server.convert import TASK_STATES, duration_from_ms, timestamp

# Outputs as JSON text answered in one GetUpstreamOutputs: room is left for their keys
# (1,000 at most, 64 characters each) and framing.
OUTPUTS_BUDGET_BYTES = MAX_RESPONSE_BYTES - 256 * 1024

# What one element of a repeated field or map costs beyond its content: its tag, its
# length prefix and, for a map entry, the key's own tag and length.
_ELEMENT_OVERHEAD = 16


def leases_into(
    answer: worker_pb2.ClaimResponse | worker_pb2.CompleteResponse,
    issued: Sequence[claims.IssuedLease],
    worker_id: str,
) -> None:
    """Puts the leases issued into a Claim's (or a Complete's) answer: the one way
    leases are answered."""
    answer.leases.extend(
        worker_pb2.Lease(
            dispatch_id=lease.dispatch_id,
            lease_token=lease.lease_token,
            fencing_token=lease.fencing_token,
            run_id=str(lease.run_id),
            task_key=lease.task_key,
            executor_kind=lease.executor_kind,
            action=lease.action,
            input=dict_to_struct(lease.input),
            attempt=lease.attempt,
            max_attempts=lease.max_attempts,
            idempotency_key=lease.idempotency_key,
            lease_expires_at=timestamp(lease.lease_expires_at),
            lease_remaining=duration_from_ms(lease.lease_remaining_ms),
            attempt_deadline=timestamp(lease.attempt_deadline),
            attempt_remaining=duration_from_ms(lease.attempt_remaining_ms),
            run_input=dict_to_struct(lease.run_input),
            upstream_states={
                key: TASK_STATES.proto(state) for key, state in lease.upstream_states.items()
            },
            traceparent=lease.trace.traceparent if lease.trace else "",
        )
        for lease in issued
    )
    fill_upstream(answer, issued)
    spans.queue_waits(issued, worker_id)


def fill_upstream(
    answer: worker_pb2.ClaimResponse | worker_pb2.CompleteResponse,
    issued: Sequence[claims.IssuedLease],
) -> None:
    """Completes a Claim answer whose leases are in (their inputs are bounded by the
    claim itself): upstream outputs, in lease and key order, while the budget lasts;
    every output left out is named in its lease's omitted_upstream_keys."""
    left = MAX_RESPONSE_BYTES - answer.ByteSize()
    # Leases of one run share upstream tasks (every element of a map has the list's
    # task upstream): each output is converted once per answer, then copied, which
    # protobuf does natively. Converting it per lease took over half the server's CPU
    # in a 100,000-element run.
    converted: dict[tuple[UUID, str], struct_pb2.Struct] = {}
    for lease, source in zip(answer.leases, issued, strict=True):
        omitted = list(source.omitted_upstream_keys)
        left -= sum(_key_cost(key) for key in omitted)
        for key in sorted(source.upstream_outputs):
            struct = converted.get((source.run_id, key))
            if struct is None:
                output = source.upstream_outputs[key]
                struct = converted[source.run_id, key] = (
                    dict_to_struct(output) or struct_pb2.Struct()
                )
            cost = struct.ByteSize() + _key_cost(key)
            if cost > left:
                omitted.append(key)
                left -= _key_cost(key)
                continue
            lease.upstream_outputs[key].CopyFrom(struct)
            left -= cost
        lease.omitted_upstream_keys.extend(sorted(omitted))


def _key_cost(key: str) -> int:
    return len(key.encode()) + _ELEMENT_OVERHEAD


def trim_run(answer: runs_pb2.GetRunResponse) -> None:
    """Leaves out of a GetRun answer, until it fits: the newest attempts, then outputs
    (last tasks first), then tracebacks, then the last tasks, counting what it left out
    (the run's own fields, with its task counts, always stay)."""
    _trim(answer, _leave_out_of_run(answer))


def trim_tasks(answer: runs_pb2.ListTasksResponse) -> None:
    """Fits a ListTasks page: outputs, then tracebacks, then the last tasks (the next
    page starts after the last one kept) are left out; at least one task stays."""
    _trim(answer, _leave_out_of_tasks(answer, None))


_Trimmed = runs_pb2.GetRunResponse | runs_pb2.ListTasksResponse


def _trim(answer: _Trimmed, left_out: Iterator[int]) -> None:
    # Sizes freed are estimates (a length prefix is 1 to 5 bytes): measure again.
    while (excess := answer.ByteSize() - MAX_RESPONSE_BYTES) > 0:
        for freed in left_out:
            excess -= freed
            if excess <= 0:
                break
        else:
            return


def _leave_out_of_run(answer: runs_pb2.GetRunResponse) -> Iterator[int]:
    """Leaves one more part out at each step; yields roughly the bytes it freed."""
    while answer.attempts:
        freed = answer.attempts[-1].ByteSize() + _ELEMENT_OVERHEAD
        del answer.attempts[-1]
        answer.attempts_omitted += 1
        yield freed
    yield from _leave_out_of_tasks(answer, answer)


def _leave_out_of_tasks(
    answer: _Trimmed, counted_in: runs_pb2.GetRunResponse | None
) -> Iterator[int]:
    """Outputs, then tracebacks, then whole tasks (counted in `counted_in`'s
    tasks_omitted when given), last tasks first."""
    for task in reversed(answer.tasks):
        if task.HasField("output"):
            freed = task.output.ByteSize() + _ELEMENT_OVERHEAD
            task.ClearField("output")
            task.output_omitted = True
            yield freed
    for task in reversed(answer.tasks):
        if task.error.traceback:
            freed = len(task.error.traceback.encode()) + _ELEMENT_OVERHEAD
            task.error.traceback = ""
            answer.tracebacks_omitted += 1
            yield freed
    while len(answer.tasks) > 1:
        freed = answer.tasks[-1].ByteSize() + _ELEMENT_OVERHEAD
        del answer.tasks[-1]
        if counted_in is not None:
            counted_in.tasks_omitted += 1
        yield freed
