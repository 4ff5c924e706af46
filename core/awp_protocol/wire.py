"""What every request must satisfy before a handler reads it, checked over its descriptor
for every RPC alike: text without NUL and within its field's length, repeated fields and
maps within their count, durations that are durations. And, for bytes that do not decode
or are too large, which field is to blame.

The limits themselves are in awp_protocol.limits (TEXT_LIMITS, COUNT_LIMITS); the field
rules of each RPC (patterns, ranges, JSON sizes) stay with its handler.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from google.protobuf import descriptor, duration_pb2, message, message_factory

from awp_protocol.errors import FieldViolation, quote
from awp_protocol.limits import (
    COUNT_LIMITS,
    MAX_JSON_DEPTH,
    MAX_REPORTED_VIOLATIONS,
    MAX_REQUEST_BYTES,
    TEXT_LIMITS,
)

OWN_PACKAGE: Final = "awp.v1."
# google.protobuf.Duration's range (its documented ±10,000 years).
_MAX_DURATION_SECONDS: Final = 315_576_000_000
_MAX_NANOS: Final = 999_999_999
# How far the search for an undecodable field descends into AWP's own messages.
_MAX_LOCATE_DEPTH: Final = 8
_LENGTH_DELIMITED: Final = 2


# ---------------------------------------------------------------- decoded requests


def request_violations(request: message.Message) -> list[FieldViolation]:
    """Every text, count and duration violation of a decoded request (the first ones: a
    request with thousands of bad fields is not walked to the end)."""
    found: list[FieldViolation] = []
    _walk(request, "", found)
    return found[: MAX_REPORTED_VIOLATIONS + 1]


def _walk(msg: message.Message, prefix: str, found: list[FieldViolation]) -> None:
    for field, value in msg.ListFields():
        if len(found) > MAX_REPORTED_VIOLATIONS:
            return
        path = prefix + field.name
        if field.is_repeated:
            limit = COUNT_LIMITS.get(field.full_name)
            if limit is not None and len(value) > limit:
                found.append(FieldViolation(path, f"at most {limit} items, got {len(value)}"))
                continue  # a huge list is not worth walking to report more
            if field.message_type is not None and _is_map(field):
                key_field, value_field = field.message_type.fields
                for key, item in value.items():
                    where = f"{path}[{quote(str(key))}]"
                    _element(key_field, key, where, found)
                    _element(value_field, item, where, found)
            else:
                for index, item in enumerate(value):
                    _element(field, item, f"{path}[{index}]", found)
        else:
            _element(field, value, path, found)


def _element(
    field: descriptor.FieldDescriptor, value: object, path: str, found: list[FieldViolation]
) -> None:
    if isinstance(value, str):
        _check_text(field, value, path, found)
    elif isinstance(value, duration_pb2.Duration):
        if not _valid_duration(value):
            found.append(FieldViolation(path, "is not a valid google.protobuf.Duration"))
    elif isinstance(value, message.Message) and _own(field.message_type):
        # google.protobuf.Struct is checked where it is converted (jsonvalue).
        _walk(value, path + ".", found)


def _check_text(
    field: descriptor.FieldDescriptor, value: str, path: str, found: list[FieldViolation]
) -> None:
    # PostgreSQL text cannot hold NUL: refused as bad input, not failed as a storage error.
    if "\x00" in value:
        found.append(FieldViolation(path, "must not contain NUL characters"))
    limit = TEXT_LIMITS.get(field.full_name)
    if limit is not None and len(value) > limit:
        found.append(FieldViolation(path, f"must be at most {limit} characters, got {len(value)}"))


def _valid_duration(value: duration_pb2.Duration) -> bool:
    seconds, nanos = value.seconds, value.nanos
    return (
        abs(seconds) <= _MAX_DURATION_SECONDS
        and abs(nanos) <= _MAX_NANOS
        and not (seconds > 0 > nanos or seconds < 0 < nanos)
    )


def _is_map(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _own(message_type: descriptor.Descriptor | None) -> bool:
    return message_type is not None and message_type.full_name.startswith(OWN_PACKAGE)


# ---------------------------------------------------------------- bytes that do not decode


def too_large(message_type: descriptor.Descriptor | None, data: bytes) -> FieldViolation:
    """The violation of a request over MAX_REQUEST_BYTES, naming its largest field."""
    sizes: dict[str, int] = {}
    if message_type is not None:
        try:
            for number, _, start, end in _wire_fields(data):
                field = message_type.fields_by_number.get(number)
                if field is not None:
                    sizes[field.name] = sizes.get(field.name, 0) + end - start
        except ValueError:
            sizes.clear()
    largest = max(sizes, key=sizes.__getitem__, default="request")
    return FieldViolation(
        largest,
        f"the request is {len(data)} bytes serialised; at most {MAX_REQUEST_BYTES}: "
        "send its items in several calls",
    )


def undecodable(message_type: descriptor.Descriptor | None, data: bytes) -> FieldViolation:
    """The violation of bytes that do not decode as `message_type`, naming the deepest
    field of AWP's own messages whose bytes are to blame ("request" when the request's
    own framing is broken)."""
    if message_type is not None:
        located = _locate(message_type, data, "", 0)
        if located is not None:
            return located
        name = message_type.full_name
    else:
        name = "the request's message"
    return FieldViolation("request", f"is not a valid {name} (malformed protobuf bytes)")


def _locate(
    message_type: descriptor.Descriptor, data: bytes, prefix: str, depth: int
) -> FieldViolation | None:
    seen: dict[int, int] = {}
    try:
        fields = list(_wire_fields(data))
    except ValueError:
        return None
    for number, wire_type, start, end in fields:
        field = message_type.fields_by_number.get(number)
        if field is None or wire_type != _LENGTH_DELIMITED:
            continue
        index = seen.get(number, 0)
        seen[number] = index + 1
        path = prefix + field.name
        if field.is_repeated and not _is_map(field):
            path += f"[{index}]"
        chunk = data[start:end]
        if field.type == descriptor.FieldDescriptor.TYPE_STRING:
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError:
                return FieldViolation(path, "is not valid UTF-8 text")
        elif field.message_type is not None:
            inner = field.message_type
            try:
                message_factory.GetMessageClass(inner).FromString(chunk)
            except message.DecodeError:
                if _own(inner) and depth < _MAX_LOCATE_DEPTH:
                    deeper = _locate(inner, chunk, path + ".", depth + 1)
                    if deeper is not None:
                        return deeper
                return FieldViolation(
                    path,
                    f"does not decode as {inner.full_name} (malformed bytes, or JSON "
                    f"nested deeper than {MAX_JSON_DEPTH} levels)",
                )
    return None


def _wire_fields(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start, end) of each top-level field of a message's bytes;
    ValueError when the framing itself is broken."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == 0:
            _, end = _varint(data, position)
            start = position
        elif wire_type == 1:
            start, end = position, position + 8
        elif wire_type == _LENGTH_DELIMITED:
            length, start = _varint(data, position)
            end = start + length
        elif wire_type == 5:
            start, end = position, position + 4
        else:
            raise ValueError(f"wire type {wire_type}")  # groups are not proto3
        if end > len(data):
            raise ValueError("truncated")
        yield number, wire_type, start, end
        position = end


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise ValueError("bad varint")
