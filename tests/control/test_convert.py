"""convert: enum maps and definition round trips (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from awp.v1 import types_pb2
from awp_kernel.definition import DefinitionInvalid
from awp_protocol import states
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
    spec = convert.spec_from_proto(original)
    b = spec.tasks[1]
    assert (b.retry.max_attempts, b.retry.initial_backoff_ms, b.retry.multiplier) == (7, 0, 1.5)
    assert b.retry.max_backoff_ms == 60_000 and b.timeout_ms == 2_500
    again = convert.spec_from_proto(convert.spec_to_proto(spec))
    assert again == spec
    assert again.definition_hash() == spec.definition_hash()


def test_spec_from_proto_collects_conversion_and_rule_violations() -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        convert.spec_from_proto(
            definition(tasks=[task("a", input=struct({"x": "\x00"})), task("a")])
        )
    fields = [v.field for v in caught.value.violations]
    assert "definition.tasks[0].input" in fields and "definition.tasks[1].key" in fields


def test_optional_fields_stay_unset() -> None:
    assert convert.timestamp(None) is None
    assert convert.task_error(None) is None
    moment = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    stamp = convert.timestamp(moment)
    assert stamp is not None and stamp.ToDatetime(tzinfo=UTC) == moment
    assert convert.duration_from_ms(-5).ToMilliseconds() == 0
