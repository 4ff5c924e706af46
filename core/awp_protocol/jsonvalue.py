"""JSON values on the wire: canonical bytes and size, and google.protobuf.Struct <-> dict.

Sizes are measured one way everywhere (server limits, worker checks): the length of the
canonical encoding, compact and with sorted keys.

Numbers: a Struct holds every number as a double, so `1` arrives as `1.0`. Integral
doubles that are exact in a double are turned back into ints on the way in, so the same
JSON gives the same canonical bytes (and hashes) whichever client produced it, jsonb
stores `1`, not `1.0`, and an action is handed the `3` its JSON said.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from google.protobuf import struct_pb2

from awp_protocol.limits import MAX_JSON_DEPTH

# Larger integral doubles are not exact integers any more: they stay floats.
_MAX_EXACT_INT: Final = 2**53


class JsonInvalid(ValueError):
    """A value that is not strict JSON, or that PostgreSQL's jsonb cannot store."""


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value, whatever the key order: the input to every hash
    and every size limit. Strict: NaN, Infinity or a non-JSON value raise ValueError or
    TypeError."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def json_size(value: Any) -> int:
    return len(canonical_json(value))


def parse_object(text: str) -> dict[str, Any]:
    """The JSON object an output travels as on its own (GetUpstreamOutputs,
    GetTaskOutput): canonical JSON, so its integers are ints, as struct_to_dict gives them.
    JsonInvalid if the text is not one JSON object."""

    def refuse(constant: str) -> Any:
        raise JsonInvalid(f"numbers must be finite, not {constant}")

    try:
        value = json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise JsonInvalid(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise JsonInvalid("must be a JSON object")
    return value


def struct_to_dict(struct: struct_pb2.Struct, depth: int = 1) -> dict[str, Any]:
    """The JSON object a Struct carries, numbers normalised (see the module docstring).

    Raises JsonInvalid for NaN/Infinity and for NUL characters, which jsonb rejects:
    they must be refused as bad input, not fail as a storage error; and for nesting
    deeper than MAX_JSON_DEPTH, which a worker could not decode in its lease.
    """
    if depth > MAX_JSON_DEPTH:
        raise JsonInvalid(f"must not be nested deeper than {MAX_JSON_DEPTH} levels")
    result: dict[str, Any] = {}
    for key, value in struct.fields.items():
        if "\x00" in key:
            raise JsonInvalid("keys must not contain NUL characters")
        result[key] = _value(value, depth)
    return result


def _value(value: struct_pb2.Value, depth: int) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise JsonInvalid("numbers must be finite (no NaN or Infinity)")
        if number.is_integer() and abs(number) <= _MAX_EXACT_INT:
            return int(number)
        return number
    if kind == "string_value":
        if "\x00" in value.string_value:
            raise JsonInvalid("strings must not contain NUL characters")
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return struct_to_dict(value.struct_value, depth + 1)
    if kind == "list_value":
        if depth + 1 > MAX_JSON_DEPTH:
            raise JsonInvalid(f"must not be nested deeper than {MAX_JSON_DEPTH} levels")
        return [_value(item, depth + 1) for item in value.list_value.values]
    return None  # null_value, or a Value with nothing set


def dict_to_struct(data: Mapping[str, Any] | None) -> struct_pb2.Struct | None:
    """None stays None (an unset field); any JSON object becomes a Struct."""
    if data is None:
        return None
    value = struct_pb2.Struct()
    value.update(data)
    return value
