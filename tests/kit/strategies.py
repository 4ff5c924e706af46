"""Hypothesis settings and JSON values for property tests, and the same value with its
keys reordered (canonical forms and hashes must not care)."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

PROPERTY = settings(max_examples=200, deadline=None)
# Generating whole JSON documents is costlier: fewer examples keep the suite fast.
JSON_PROPERTY = settings(max_examples=60, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)


def json_objects(*, max_leaves: int, max_keys: int) -> st.SearchStrategy[dict[str, Any]]:
    values = st.recursive(
        json_scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=max_leaves,
    )
    return st.dictionaries(st.text(max_size=4), values, max_size=max_keys)


def reorder(value: Any) -> Any:
    """The same JSON value with every object's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {key: reorder(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(item) for item in value]
    return value
