"""Canonical result hashing: what makes a repeated Complete a DUPLICATE or a CONFLICT."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from awp_protocol.jsonvalue import canonical_json
from awp_protocol.results import CheckedResult

_NO_DETAILS: Mapping[str, str] = MappingProxyType({})


def result_hash(
    outcome: Literal["succeeded", "failed"],
    output: Mapping[str, Any] | None,
    error_message: str | None,
    retryable: bool,
    error_details: Mapping[str, str] = _NO_DETAILS,
) -> bytes:
    """SHA-256 over only the fields a worker reports, in canonical form.

    error_details are a failure's optional fields (type, traceback, log_tail); empty ones
    are left out, so a failure without them hashes as it did before they existed.
    """
    fields: dict[str, Any] = {"outcome": outcome}
    if outcome == "succeeded":
        fields["output"] = dict(output or {})
    else:
        details = {name: value for name, value in error_details.items() if value}
        fields["error"] = {"message": error_message or "", "retryable": retryable, **details}
    return hashlib.sha256(canonical_json(fields)).digest()


def digest_of(result: CheckedResult) -> bytes:
    """The hash of a checked result, as its lease keeps it once accepted."""
    details = {
        "type": result.error_type,
        "traceback": result.traceback,
        "log_tail": result.log_tail,
    }
    return result_hash(
        result.outcome, result.output, result.error_message, result.retryable, details
    )
