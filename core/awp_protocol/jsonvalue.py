"""JSON values on the wire: canonical bytes and size, and google.protobuf.Struct <-> dict.

Sizes are measured one way everywhere (server limits, worker checks): the length of the
canonical encoding, compact and with sorted keys.

Numbers: a Struct holds every number as a double, so `1` arrives as `1.0`. Integral
doubles that are exact in a double are turned back into ints on the way in, so the same
JSON gives the same canonical bytes (and hashes) whichever client produced it, jsonb
stores `1`, not `1.0`, and an action is handed the `3` its JSON said. The other way,
`to_struct` refuses an integer beyond MAX_EXACT_INT rather than send it rounded: every
client (SDK, CLI, worker outputs) converts through it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from google.protobuf import json_format, struct_pb2

from awp_protocol.limits import MAX_EXACT_INT, MAX_JSON_DEPTH

EXACT_RANGE: Final = f"-2**53 to 2**53 ({-MAX_EXACT_INT} to {MAX_EXACT_INT})"


class JsonInvalid(ValueError):
    """A value that is not strict JSON, or that PostgreSQL's jsonb cannot store; `where`
    (when known) is the path of the offending value, e.g. "input.items[2]"."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.problem = problem
        self.where = where


def canonical_json(value: Any) -> bytes:
    """One byte string per JSON value, whatever the key order: the input to every hash
    and every size limit. Strict: NaN, Infinity or a non-JSON value raise ValueError or
    TypeError."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def json_size(value: Any) -> int:
    return len(canonical_json(value))


def _loads(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise JsonInvalid(f"numbers must be finite, not {constant}")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise JsonInvalid(f"not JSON: {exc}") from None
    except RecursionError:
        raise JsonInvalid(f"nested deeper than {MAX_JSON_DEPTH} levels") from None


def parse_value(text: str, where: str = "value") -> Any:
    """Any JSON value that travels as text (a step's memo), held to the rules of a value
    a client sends (to_struct's): JsonInvalid naming the problem otherwise."""
    value = _loads(text)
    _check(value, where, 1)
    return value


def parse_object(text: str) -> dict[str, Any]:
    """The JSON object an output travels as on its own (GetUpstreamOutputs,
    GetTaskOutput): canonical JSON, so its integers are ints, as struct_to_dict gives them.
    JsonInvalid if the text is not one JSON object."""
    value = _loads(text)
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
        return exact_number(number)
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


def exact_number(number: float) -> int | float:
    """A Struct number as the JSON it came from said it: an int when integral and within
    MAX_EXACT_INT (larger integral doubles are not exact integers any more)."""
    if number.is_integer() and abs(number) <= MAX_EXACT_INT:
        return int(number)
    return number


def to_struct(data: Mapping[str, Any], where: str = "value") -> struct_pb2.Struct:
    """A JSON object from a client as a Struct, carried exactly, or JsonInvalid naming the
    first place (`where`, e.g. "input", then the path) that cannot be: an integer beyond
    MAX_EXACT_INT, NaN or Infinity, a non-string key, a value that is not JSON, NUL
    characters, nesting deeper than MAX_JSON_DEPTH."""
    _check(data, where, 1)
    struct = struct_pb2.Struct()
    struct.update(data)
    return struct


def to_value(data: Any, where: str = "value") -> struct_pb2.Value:
    """Any JSON value from a client (an object, a list, a string, a number, a bool or
    None) as a Value, carried exactly, or JsonInvalid as to_struct says."""
    _check(data, where, 1)
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value


def _check(value: Any, where: str, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise JsonInvalid(f"nested deeper than {MAX_JSON_DEPTH} levels", where)
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise JsonInvalid(
                f"the integer {value} is outside {EXACT_RANGE}, the range a JSON number "
                "keeps exactly on the wire; send it as a string",
                where,
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise JsonInvalid(f"{value} is not a JSON number", where)
    elif isinstance(value, str):
        if "\x00" in value:
            raise JsonInvalid("strings must not contain NUL characters", where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check(item, f"{where}[{index}]", depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise JsonInvalid(f"the key {key!r} is not a string", where)
            if "\x00" in key:
                raise JsonInvalid("keys must not contain NUL characters", where)
            _check(item, f"{where}.{key}", depth + 1)
    else:
        raise JsonInvalid(f"a {type(value).__name__} is not a JSON value (make it a string)", where)


def dict_to_struct(data: Mapping[str, Any] | None) -> struct_pb2.Struct | None:
    """None stays None (an unset field); any JSON object becomes a Struct.

    For values the server has already read (stored JSON): integers beyond MAX_EXACT_INT
    in them came in as doubles and go back out as the same doubles. What clients send
    goes through `to_struct`.
    """
    if data is None:
        return None
    value = struct_pb2.Struct()
    value.update(data)
    return value
