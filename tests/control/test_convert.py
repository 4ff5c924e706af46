"""convert: enum maps and definition round trips (no I/O)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from awp.v1 import types_pb2
from awp_db.events import StoredEvent
from awp_kernel.definition import DefinitionInvalid
from awp_kernel.definition_proto import spec_from_proto
from awp_protocol import states
from awp_protocol.jsonvalue import struct_to_dict
from awp_server import convert
from control.helpers import definition, task
from kit.proto import seconds, struct


@pytest.mark.parametrize(
    ("enum_map", "enum", "names"),
    [
        (convert.RUN_STATES, types_pb2.RunState, states.RUN_STATES),
        (convert.TASK_STATES, types_pb2.TaskState, states.TASK_STATES),
        (convert.ATTEMPT_STATES, types_pb2.AttemptState, states.ATTEMPT_STATES),
        (convert.DISPATCH_STATES, types_pb2.DispatchState, states.DISPATCH_STATES),
        (convert.WORKER_STATES, types_pb2.WorkerState, states.WORKER_STATES),
    ],
)
def test_enum_maps_cover_every_state_both_ways(
    enum_map: convert.EnumMap[int], enum: object, names: tuple[str, ...]
) -> None:
    proto_values = {v for v in enum.values() if v != 0}  # type: ignore[attr-defined]
    assert {enum_map.proto(name) for name in names} == proto_values
    for name in names:
        assert enum_map.name(enum_map.proto(name)) == name
    assert enum_map.name(0) is None  # UNSPECIFIED is never a state
    assert enum_map.name(999) is None


def test_event_types_are_the_ones_storage_writes() -> None:
    assert set(convert.EVENT_TYPES.to_proto) == {
        "run.created",
        "run.state",
        "task.state",
        "attempt.state",
        "run.cancel_requested",
    }
    assert convert.EVENT_TYPES.proto("run.cancel_requested") == (
        types_pb2.EVENT_TYPE_RUN_CANCEL_REQUESTED
    )


def event_row(kind: str, before: str | None, after: str | None) -> StoredEvent:
    return StoredEvent(
        run_id=uuid.UUID(int=1),
        seq=7,
        revision=3,
        type=kind,
        task_key=None if kind.startswith("run.") else "t",
        attempt=2 if kind == "attempt.state" else None,
        from_state=before,
        to_state=after,
        payload={"reason": "why"},
        created_at=datetime(2030, 1, 2, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            event_row("run.created", None, "running"),
            types_pb2.StateEvent(
                type=types_pb2.EVENT_TYPE_RUN_CREATED,
                run_transition={"to_state": types_pb2.RUN_STATE_RUNNING},
            ),
        ),
        (
            event_row("run.state", "running", "failed"),
            types_pb2.StateEvent(
                type=types_pb2.EVENT_TYPE_RUN_STATE,
                run_transition={
                    "from_state": types_pb2.RUN_STATE_RUNNING,
                    "to_state": types_pb2.RUN_STATE_FAILED,
                },
            ),
        ),
        (
            event_row("task.state", "running", "waiting_retry"),
            types_pb2.StateEvent(
                type=types_pb2.EVENT_TYPE_TASK_STATE,
                task_transition={
                    "from_state": types_pb2.TASK_STATE_RUNNING,
                    "to_state": types_pb2.TASK_STATE_WAITING_RETRY,
                },
            ),
        ),
        (
            event_row("attempt.state", None, "running"),
            types_pb2.StateEvent(
                type=types_pb2.EVENT_TYPE_ATTEMPT_STATE,
                attempt_transition={"to_state": types_pb2.ATTEMPT_STATE_RUNNING},
            ),
        ),
        (
            event_row("run.cancel_requested", None, None),
            types_pb2.StateEvent(type=types_pb2.EVENT_TYPE_RUN_CANCEL_REQUESTED),
        ),
        # Written by a newer version: this server can name neither its type nor its states.
        (event_row("run.paused", "running", "paused"), types_pb2.StateEvent()),
    ],
)
def test_events_carry_typed_transitions(
    row: dict[str, Any], expected: types_pb2.StateEvent
) -> None:
    event = convert.event_to_proto(row)
    assert (event.run_id, event.seq, event.revision) == (str(row.run_id), 7, 3)
    assert (event.task_key, event.attempt) == (row.task_key or "", row.attempt or 0)
    assert struct_to_dict(event.payload) == {"reason": "why"}
    assert event.created_at.ToDatetime(tzinfo=UTC) == row.created_at
    which = event.WhichOneof("transition")
    assert (event.type, which) == (expected.type, expected.WhichOneof("transition"))
    if which is not None:
        assert getattr(event, which) == getattr(expected, which)


def test_waiting_retry_maps_to_its_enum() -> None:
    assert convert.TASK_STATES.proto("waiting_retry") == types_pb2.TASK_STATE_WAITING_RETRY
    assert convert.ATTEMPT_STATES.proto("timed_out") == types_pb2.ATTEMPT_STATE_TIMED_OUT


def test_definition_round_trip_is_stable() -> None:
    original = definition(
        tasks=[
            task("a", input=struct({"n": 1})),
            task(
                "b",
                ["a"],
                retry=types_pb2.RetryPolicy(
                    max_attempts=7, initial_backoff=seconds(0), backoff_multiplier=1.5
                ),
                timeout=seconds(2.5),
            ),
        ],
        concurrency=2,
    )
    spec = spec_from_proto(original)
    b = spec.tasks[1]
    assert (b.retry.max_attempts, b.retry.initial_backoff_ms, b.retry.multiplier) == (7, 0, 1.5)
    assert b.retry.max_backoff_ms == 60_000 and b.timeout_ms == 2_500
    again = spec_from_proto(convert.spec_to_proto(spec))
    assert again == spec
    assert again.definition_hash() == spec.definition_hash()


def test_spec_from_proto_collects_conversion_and_rule_violations() -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        spec_from_proto(definition(tasks=[task("a", input=struct({"x": "\x00"})), task("a")]))
    fields = [v.field for v in caught.value.violations]
    assert "definition.tasks[0].input" in fields and "definition.tasks[1].key" in fields


def test_optional_fields_stay_unset() -> None:
    assert convert.timestamp(None) is None
    assert convert.task_error(None) is None
    moment = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    stamp = convert.timestamp(moment)
    assert stamp is not None and stamp.ToDatetime(tzinfo=UTC) == moment
    assert convert.duration_from_ms(-5).ToMilliseconds() == 0
