"""The wire speaks one vocabulary: every state in awp.v1 travels as its enum."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from awp.v1 import control_pb2, worker_pb2

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


def _api_files() -> Iterator[FileDescriptor]:
    """Every awp.v1 file the two services' files import, transitively: the messages are
    spread over several files, and a file split off later is covered without a change."""
    seen: set[str] = set()
    pending = [control_pb2.DESCRIPTOR, worker_pb2.DESCRIPTOR]
    while pending:
        file = pending.pop()
        if file.name in seen or file.package != "awp.v1":
            continue
        seen.add(file.name)
        yield file
        pending.extend(file.dependencies)


def test_no_state_travels_as_a_string() -> None:
    strays = []
    for file in _api_files():
        for message in _messages(file.message_types_by_name.values()):
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
