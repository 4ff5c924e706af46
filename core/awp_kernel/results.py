"""Canonical result hashing: what makes a repeated Complete a DUPLICATE or a CONFLICT."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

from awp_protocol.jsonvalue import canonical_json


def result_hash(
    outcome: Literal["succeeded", "failed"],
    output: Mapping[str, Any] | None,
    error_message: str | None,
    retryable: bool,
) -> bytes:
    """SHA-256 over only the fields a worker reports, in canonical form."""
    fields: dict[str, Any] = {"outcome": outcome}
    if outcome == "succeeded":
        fields["output"] = dict(output or {})
    else:
        fields["error"] = {"message": error_message or "", "retryable": retryable}
    return hashlib.sha256(canonical_json(fields)).digest()
