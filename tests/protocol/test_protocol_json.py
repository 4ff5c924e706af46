"""JSON on the wire: canonical bytes and size, Struct <-> dict normalisation (no I/O)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from awp_protocol.jsonvalue import (
    JsonInvalid,
    canonical_json,
    dict_to_struct,
    json_size,
    struct_to_dict,
)


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(data)
    return value


def test_struct_numbers_are_normalised() -> None:
    data = struct_to_dict(
        struct({"i": 1, "f": 1.5, "neg": -3.0, "huge": 2.0**60, "l": [2, {"z": 0}], "n": None})
    )
    assert data == {"i": 1, "f": 1.5, "neg": -3, "huge": 2.0**60, "l": [2, {"z": 0}], "n": None}
    assert type(data["i"]) is int and type(data["huge"]) is float
    again = dict_to_struct(data)
    assert again is not None
    assert canonical_json(data) == canonical_json(struct_to_dict(again))


@pytest.mark.parametrize(
    "bad",
    [
        {"x": float("nan")},
        {"x": [float("-inf")]},
        {"x": "a\x00"},
        {"a\x00": 1},
        {"d": {"e": "\x00"}},
    ],
)
def test_struct_values_jsonb_cannot_hold_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(JsonInvalid):
        struct_to_dict(struct(bad))


def test_none_stays_an_unset_field() -> None:
    assert dict_to_struct(None) is None


def test_canonical_json_is_compact_sorted_utf8_and_strict() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": "é"}]}) == (
        '{"a":[1,{"c":"é","d":null}],"b":1}'.encode()
    )
    assert json_size({"x": "é"}) == len('{"x":""}') + 2
    for bad in ({"x": math.nan}, {"x": math.inf}):
        with pytest.raises(ValueError):
            canonical_json(bad)
    with pytest.raises(TypeError):
        canonical_json({"x": object()})


# What jsonb stores: no NUL characters, no lone surrogates.
TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(TEXT, JSON, max_size=6))
def test_a_round_trip_keeps_the_canonical_bytes(data: dict[str, Any]) -> None:
    """Whatever a client sends through a Struct is measured and hashed the same way."""
    through = dict_to_struct(data)
    assert through is not None
    once = struct_to_dict(through)
    again = dict_to_struct(once)
    assert again is not None
    assert canonical_json(struct_to_dict(again)) == canonical_json(once)
    assert json_size(once) == len(canonical_json(once))
