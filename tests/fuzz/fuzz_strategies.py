"""Hypothesis strategies for request bytes: messages generated from their descriptors
(with hostile text, numbers and durations), JSON nested past every limit, and byte-level
mutations of all of these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf import descriptor, duration_pb2, message, message_factory, struct_pb2
from google.protobuf.internal import encoder
from hypothesis import strategies as st

from awp_protocol.limits import MAX_JSON_DEPTH
from kit.strategies import json_objects

FieldType = descriptor.FieldDescriptor
# Text a request may carry: ordinary, NUL, just over limits, far over every limit.
HOSTILE_TEXT = ["", "\x00", "a\x00b", "é"]
LONG_TEXT = [65, 129, 257, 1025, 20_000]  # lengths, repeated "x"s
INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**53, 2**63 - 1, -(2**63)]


def _text(known: Sequence[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([*known, *HOSTILE_TEXT]),
        st.sampled_from(LONG_TEXT).map(lambda length: "x" * length),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    )


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(max(low, 0), min(high, 8)),  # small values: what valid requests hold
        st.sampled_from([v for v in INT_EDGES if low <= v <= high]),
        st.integers(low, high),
    )


_RANGES = {
    FieldType.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldType.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldType.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldType.TYPE_UINT32: (0, 2**32 - 1),
    FieldType.TYPE_UINT64: (0, 2**64 - 1),
}


def durations() -> st.SearchStrategy[duration_pb2.Duration]:
    # Valid ones, negative ones, nanos out of range, signs that disagree, beyond ±10,000 y.
    valid = st.builds(
        duration_pb2.Duration, seconds=st.integers(0, 2), nanos=st.integers(0, 999_999_999)
    )
    return valid | st.builds(
        duration_pb2.Duration,
        seconds=_integers(-(2**63), 2**63 - 1) | st.integers(-5, 400),
        nanos=_integers(-(2**31), 2**31 - 1) | st.integers(-999_999_999, 999_999_999),
    )


def structs() -> st.SearchStrategy[struct_pb2.Struct]:
    def to_struct(data: dict[str, Any]) -> struct_pb2.Struct:
        value = struct_pb2.Struct()
        value.update(data)
        return value

    plain = json_objects(max_leaves=6, max_keys=3).map(to_struct)
    hostile = st.sampled_from(
        [{"k\x00": 1}, {"s": "nul\x00"}, {"f": float("nan")}, {"f": float("inf")}]
    ).map(to_struct)
    big = st.just(70 * 1024).map(lambda size: to_struct({"big": "x" * size}))
    # At the depth limit; deeper ones cannot even be built (deep_struct_bytes sends them).
    deep = st.sampled_from([MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH]).map(nested)
    return plain | hostile | big | deep


def nested(depth: int) -> struct_pb2.Struct:
    """A JSON object `depth` levels deep (within what protobuf itself decodes)."""
    top = struct_pb2.Struct()
    level = top
    for _ in range(depth - 1):
        level = level.fields["a"].struct_value
    level.fields["x"].number_value = 1
    return top


def messages(
    message_type: descriptor.Descriptor,
    known: Sequence[str],
    overrides: dict[str, st.SearchStrategy[Any]],
    depth: int = 0,
) -> st.SearchStrategy[message.Message]:
    """Messages of `message_type`, any subset of fields set; `overrides` supplies
    strategies by message full name (e.g. a real session)."""
    name = message_type.full_name
    if name in overrides:
        return overrides[name]
    if name == "google.protobuf.Struct":
        return structs()
    if name == "google.protobuf.Duration":
        return durations()
    cls = message_factory.GetMessageClass(message_type)
    if depth > 4:
        return st.just(cls())
    optional = {field.name: _field(field, known, overrides, depth) for field in message_type.fields}
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: cls(**kw))


def _field(
    field: descriptor.FieldDescriptor,
    known: Sequence[str],
    overrides: dict[str, st.SearchStrategy[Any]],
    depth: int,
) -> st.SearchStrategy[Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_field, value_field = field.message_type.fields
        return st.dictionaries(
            _scalar(key_field, known, overrides, depth),
            _scalar(value_field, known, overrides, depth),
            max_size=3,
        ) | st.just(70).map(lambda count: {f"k{i}": _small(value_field) for i in range(count)})
    single = _scalar(field, known, overrides, depth)
    if field.is_repeated:
        # Over every count limit, of small items (large ones are what LONG_TEXT tries).
        many = st.just(_OVER_EVERY_COUNT).map(lambda count: [_small(field)] * count)
        return st.lists(single, max_size=3) | many
    return single


_OVER_EVERY_COUNT = 10_001


def _small(field: descriptor.FieldDescriptor) -> Any:
    if field.message_type is not None:
        return message_factory.GetMessageClass(field.message_type)()
    return "k" if field.type == FieldType.TYPE_STRING else 0


def _scalar(
    field: descriptor.FieldDescriptor,
    known: Sequence[str],
    overrides: dict[str, st.SearchStrategy[Any]],
    depth: int,
) -> st.SearchStrategy[Any]:
    if field.message_type is not None:
        return messages(field.message_type, known, overrides, depth + 1)
    if field.type == FieldType.TYPE_STRING:
        return _text(known)
    if field.type == FieldType.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldType.TYPE_DOUBLE:
        return st.floats() | st.sampled_from([1.0, 2.0, 0.5])
    return _integers(*_RANGES[field.type])


# ---------------------------------------------------------------- bytes


Mutation = Callable[[bytes, st.DataObject], bytes]


def _flip(data: bytes, draw: st.DataObject) -> bytes:
    if not data:
        return data
    at = draw.draw(st.integers(0, len(data) - 1))
    return data[:at] + bytes([data[at] ^ draw.draw(st.integers(1, 255))]) + data[at + 1 :]


def _truncate(data: bytes, draw: st.DataObject) -> bytes:
    return data[: draw.draw(st.integers(0, max(0, len(data) - 1)))]


def _insert(data: bytes, draw: st.DataObject) -> bytes:
    at = draw.draw(st.integers(0, len(data)))
    return data[:at] + draw.draw(st.binary(min_size=1, max_size=8)) + data[at:]


def _duplicate(data: bytes, draw: st.DataObject) -> bytes:
    # Concatenated messages merge: repeated fields grow, scalars are overwritten.
    return data + data


def _length_lie(data: bytes, draw: st.DataObject) -> bytes:
    # A length-delimited field that claims more bytes than follow.
    return data + encoder.TagBytes(draw.draw(st.integers(1, 20)), 2) + b"\xff\xff\x03ab"  # type: ignore[attr-defined]


MUTATIONS: list[Mutation] = [_flip, _truncate, _insert, _duplicate, _length_lie]


def mutate(data: bytes, draw: st.DataObject) -> bytes:
    for _ in range(draw.draw(st.integers(1, 3))):
        data = draw.draw(st.sampled_from(MUTATIONS))(data, draw)
    return data
