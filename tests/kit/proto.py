"""Protobuf values for tests: Structs and Durations built from Python, results read back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2
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
