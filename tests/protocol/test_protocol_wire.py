"""The generic request checks: every text and list field of every request has its limit,
error text stays short, and JSON depth is bounded where Structs are converted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf import descriptor, struct_pb2

from awp.v1 import control_pb2, worker_pb2
from awp_protocol.errors import FieldViolation, join_violations, quote
from awp_protocol.jsonvalue import JsonInvalid, struct_to_dict
from awp_protocol.limits import (
    COUNT_LIMITS,
    MAX_JSON_DEPTH,
    MAX_REPORTED_VIOLATIONS,
    QUOTE_CHARS,
    TEXT_LIMITS,
)
from awp_protocol.wire import request_violations
from kit.proto import deep_struct_bytes

REQUESTS = [
    method.input_type
    for file, service in (
        (worker_pb2.DESCRIPTOR, "WorkerService"),
        (control_pb2.DESCRIPTOR, "ControlService"),
    )
    for method in file.services_by_name[service].methods
]


def _fields(
    message_type: descriptor.Descriptor, seen: set[str]
) -> Iterator[descriptor.FieldDescriptor]:
    if message_type.full_name in seen or not message_type.full_name.startswith("awp.v1."):
        return
    seen.add(message_type.full_name)
    for field in message_type.fields:
        yield field
        if field.message_type is not None:
            yield from _fields(field.message_type, seen)


ALL_FIELDS = {field.full_name: field for request in REQUESTS for field in _fields(request, set())}


def test_every_text_field_of_every_request_has_a_length_limit() -> None:
    text = {
        name
        for name, field in ALL_FIELDS.items()
        if field.type == descriptor.FieldDescriptor.TYPE_STRING
    }
    assert text - set(TEXT_LIMITS) == set()
    assert set(TEXT_LIMITS) - text == set()  # no limit for a field that does not exist


def test_every_repeated_field_and_map_of_every_request_has_a_count_limit() -> None:
    lists = {
        name
        for name, field in ALL_FIELDS.items()
        if field.is_repeated and not name.endswith(("Entry.key", "Entry.value"))
    }
    assert lists - set(COUNT_LIMITS) == set()
    assert set(COUNT_LIMITS) - lists == set()


def test_quote_keeps_a_short_prefix() -> None:
    assert quote("abc") == "'abc'"
    long = quote("x" * 20_000)
    assert len(long) < QUOTE_CHARS + 40
    assert "20000 characters" in long


def test_an_error_lists_the_first_violations_and_counts_the_rest() -> None:
    violations = [FieldViolation(f"f{i}", "bad") for i in range(MAX_REPORTED_VIOLATIONS + 5)]
    text = join_violations(violations)
    assert text.count("bad") == MAX_REPORTED_VIOLATIONS
    assert text.endswith("and 5 more")


def test_a_request_with_thousands_of_bad_fields_is_not_walked_to_the_end() -> None:
    request = worker_pb2.HeartbeatRequest(leases=[worker_pb2.LeaseRef(lease_token="\x00")] * 1_000)
    assert len(request_violations(request)) == MAX_REPORTED_VIOLATIONS + 1


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_struct_depth_is_bounded(depth: int) -> None:
    value = struct_pb2.Struct.FromString(deep_struct_bytes(depth))
    if depth <= MAX_JSON_DEPTH:
        struct_to_dict(value)
    else:
        with pytest.raises(JsonInvalid, match=f"{MAX_JSON_DEPTH} levels"):
            struct_to_dict(value)


def test_lists_count_as_levels_too() -> None:
    value = struct_pb2.Struct()
    level = value.get_or_create_list("a")
    for _ in range(MAX_JSON_DEPTH - 1):
        level = level.add_list()
    with pytest.raises(JsonInvalid):
        struct_to_dict(value)
