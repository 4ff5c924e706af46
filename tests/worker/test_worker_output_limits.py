"""The worker measures and refuses outputs exactly as the server does (awp_protocol)."""

from __future__ import annotations

import pytest

from awp_protocol.jsonvalue import json_size, struct_to_dict
from awp_protocol.limits import MAX_OUTPUT_BYTES
from awp_sdk.actions import OutputError, output_struct


def output_of_size(size: int) -> dict[str, object]:
    """A many-key output whose canonical size is `size`: a spaced encoding is far larger."""
    output: dict[str, object] = {f"k{i:05}": i for i in range(10_000)}
    output["pad"] = ""
    output["pad"] = "x" * (size - json_size(output))
    assert json_size(output) == size
    return output


def test_an_output_of_exactly_the_limit_is_reported() -> None:
    output = output_of_size(MAX_OUTPUT_BYTES)
    assert json_size(struct_to_dict(output_struct(output))) == MAX_OUTPUT_BYTES


def test_one_byte_more_is_refused() -> None:
    with pytest.raises(OutputError, match=f"{MAX_OUTPUT_BYTES + 1} bytes"):
        output_struct(output_of_size(MAX_OUTPUT_BYTES + 1))


@pytest.mark.parametrize("bad", [{"x": "a\x00"}, {"a\x00": 1}])
def test_what_jsonb_cannot_store_fails_the_attempt(bad: dict[str, object]) -> None:
    with pytest.raises(OutputError, match="NUL"):
        output_struct(bad)
