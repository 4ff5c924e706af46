"""Result hashing: a repeated Complete is a DUPLICATE only if it reports the same result."""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from awp_kernel.results import result_hash
from kit import strategies
from kit.strategies import JSON_PROPERTY, PROPERTY, reorder

json_objects = strategies.json_objects(max_leaves=8, max_keys=5)


def test_hash_is_sha256_of_the_canonical_fields() -> None:
    # Pinned: stored hashes must keep matching across releases.
    assert (
        result_hash("succeeded", {"b": 2, "a": 1}, None, False)
        == hashlib.sha256(b'{"outcome":"succeeded","output":{"a":1,"b":2}}').digest()
    )
    assert (
        result_hash("failed", None, "boom", True)
        == hashlib.sha256(
            b'{"error":{"message":"boom","retryable":true},"outcome":"failed"}'
        ).digest()
    )


@JSON_PROPERTY
@given(json_objects)
def test_output_key_order_does_not_matter(output: dict[str, Any]) -> None:
    digest = result_hash("succeeded", output, None, False)
    assert len(digest) == 32
    assert result_hash("succeeded", reorder(output), None, False) == digest


@JSON_PROPERTY
@given(json_objects, json_objects)
def test_different_outputs_differ(first: dict[str, Any], second: dict[str, Any]) -> None:
    same = result_hash("succeeded", first, None, False) == result_hash(
        "succeeded", second, None, False
    )
    if same:
        assert first == second
    if repr(first) == repr(second):
        assert same


def test_outputs_differing_deep_inside_differ() -> None:
    assert result_hash("succeeded", {"a": {"b": [1, 2]}}, None, False) != result_hash(
        "succeeded", {"a": {"b": [2, 1]}}, None, False
    )
    assert result_hash("succeeded", {"a": 1}, None, False) != result_hash(
        "succeeded", {"a": "1"}, None, False
    )


@PROPERTY
@given(st.text(max_size=30), st.text(max_size=30), st.booleans(), st.booleans())
def test_failure_hash_tracks_message_and_retryable(
    message_a: str, message_b: str, retryable_a: bool, retryable_b: bool
) -> None:
    hash_a = result_hash("failed", None, message_a, retryable_a)
    hash_b = result_hash("failed", None, message_b, retryable_b)
    assert (hash_a == hash_b) == (message_a == message_b and retryable_a == retryable_b)


def test_outcome_matters() -> None:
    assert result_hash("succeeded", None, None, False) != result_hash("failed", None, None, False)
    assert result_hash("succeeded", {}, "", True) != result_hash("failed", {}, "", True)


def test_retryable_matters_for_failures() -> None:
    assert result_hash("failed", None, "boom", True) != result_hash("failed", None, "boom", False)


def test_message_matters_for_failures() -> None:
    assert result_hash("failed", None, "boom", True) != result_hash("failed", None, "bang", True)
    assert result_hash("failed", None, "naïve ✓", True) != result_hash(
        "failed", None, "naive", True
    )


def test_only_reported_fields_count() -> None:
    # A success has no error; a failure has no output.
    assert result_hash("succeeded", {"a": 1}, "ignored", True) == result_hash(
        "succeeded", {"a": 1}, None, False
    )
    assert result_hash("failed", {"ignored": 1}, "boom", True) == result_hash(
        "failed", None, "boom", True
    )


def test_absent_equals_empty() -> None:
    assert result_hash("succeeded", None, None, False) == result_hash("succeeded", {}, None, False)
    assert result_hash("failed", None, None, False) == result_hash("failed", None, "", False)


def test_hash_is_deterministic() -> None:
    output = {"rows": [1, 2, 3], "summary": {"ok": True, "ratio": 0.5}}
    assert result_hash("succeeded", output, None, False) == result_hash(
        "succeeded", dict(output), None, False
    )
