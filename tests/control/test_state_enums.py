"""The wire speaks one vocabulary: every state in awp.v1 travels as its enum."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from awp.v1 import control_pb2, types_pb2, worker_pb2

# Proto map keys cannot be enums, so a map keyed by state would carry it as a string:
# the API's only maps are keyed by free-form labels, by task keys and by resource names
# (placement: a worker's capacities and reservations, a task's units).
MAPS: frozenset[str] = frozenset(
    {"labels", "upstream_outputs", "upstream_states", "resources", "reserved"}
)


def _messages(found: Iterable[Descriptor]) -> Iterator[Descriptor]:
    for message in found:
        yield message
        yield from _messages(message.nested_types)


def test_no_state_travels_as_a_string() -> None:
    strays = []
    for module in (control_pb2, types_pb2, worker_pb2):
        for message in _messages(module.DESCRIPTOR.message_types_by_name.values()):
            if message.GetOptions().map_entry:
                continue
            for field in message.fields:
                is_map = (
                    field.message_type is not None and field.message_type.GetOptions().map_entry
                )
                if is_map and field.name not in MAPS:
                    strays.append(f"{message.full_name}.{field.name} (a map)")
                elif is_map and "state" in field.name:
                    value = field.message_type.fields_by_name["value"]
                    if value.type != FieldDescriptor.TYPE_ENUM:
                        strays.append(f"{message.full_name}.{field.name} (its values)")
                elif (
                    "state" in field.name
                    and field.message_type is None
                    and field.type != FieldDescriptor.TYPE_ENUM
                ):
                    strays.append(f"{message.full_name}.{field.name}")
    assert strays == []
