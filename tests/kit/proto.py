"""Protobuf values for tests: Structs and Durations built from Python, results read back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2
from google.protobuf.internal import encoder
from google.protobuf.message import Message

from awp.v1 import worker_pb2


def struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(dict(data))
    return value


def seconds(value: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(value * 1e9))
    return duration


def to_dict(message: Message) -> dict[str, Any]:
    """A message (a Struct: a result's output, a run's input) as plain JSON values."""
    return json_format.MessageToDict(message)


def output(result: worker_pb2.TaskResult) -> dict[str, Any]:
    """A reported result's output as plain JSON values."""
    return to_dict(result.output)


def length_delimited(number: int, payload: bytes) -> bytes:
    return encoder.TagBytes(number, 2) + encoder._VarintBytes(len(payload)) + payload  # type: ignore[attr-defined]


def deep_struct_bytes(depth: int) -> bytes:
    """A Struct `depth` levels deep, encoded by hand: protobuf refuses to build one past
    its own decoding limit, and such bytes are exactly what a hostile client sends."""
    inner = struct_pb2.Struct(fields={"x": struct_pb2.Value(number_value=1)}).SerializeToString()
    for _ in range(depth - 1):
        value = length_delimited(5, inner)  # Value.struct_value
        entry = length_delimited(1, b"a") + length_delimited(2, value)  # FieldsEntry
        inner = length_delimited(1, entry)  # Struct.fields
    return inner
