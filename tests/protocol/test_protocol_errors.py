"""Rich errors: the reasons come from the proto enum, and what the server encodes every
client decodes the same way (no I/O)."""

from __future__ import annotations

import grpc
from google.rpc import code_pb2, status_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from awp.v1 import errors_pb2
from awp_protocol.errors import (
    ERROR_DOMAIN,
    PERMANENT_REASONS,
    STATUS_DETAILS_KEY,
    TRANSIENT_CODES,
    ErrorDetails,
    FieldViolation,
    Reason,
    decode_details,
    encode_status,
)


def test_every_proto_reason_has_its_string_and_no_other_exists() -> None:
    names = {name for name, _ in errors_pb2.ErrorReason.items()} - {"ERROR_REASON_UNSPECIFIED"}
    assert {f"ERROR_REASON_{reason.value}" for reason in Reason} == names
    assert all(reason.name == reason.value for reason in Reason)
    assert Reason.SESSION_INVALID == "SESSION_INVALID"  # what goes into ErrorInfo.reason


def test_permanent_reasons_and_transient_codes() -> None:
    assert {Reason.SESSION_INVALID, Reason.PROTOCOL_UNSUPPORTED} <= PERMANENT_REASONS
    assert Reason.WORKER_DRAINING not in PERMANENT_REASONS  # the session goes on
    assert {code_pb2.UNAVAILABLE, code_pb2.DEADLINE_EXCEEDED} <= TRANSIENT_CODES
    assert not {code_pb2.INVALID_ARGUMENT, code_pb2.UNAUTHENTICATED} & TRANSIENT_CODES
    # The same numbers gRPC itself uses.
    assert {grpc.StatusCode.UNAVAILABLE.value[0], grpc.StatusCode.CANCELLED.value[0]} <= (
        TRANSIENT_CODES
    )


def trailers(status: status_pb2.Status) -> list[tuple[str, str | bytes]]:
    return [("other", "x"), (STATUS_DETAILS_KEY, status.SerializeToString())]


FIELDS = st.text(min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(list(Reason)),
    st.dictionaries(FIELDS, st.text(max_size=10), max_size=3),
    st.lists(st.builds(FieldViolation, FIELDS, st.text(max_size=30)), max_size=4),
)
def test_what_is_encoded_is_decoded(
    reason: Reason, metadata: dict[str, str], violations: list[FieldViolation]
) -> None:
    status = encode_status(code_pb2.INVALID_ARGUMENT, "bad", reason, metadata, violations)
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message == "bad"
    assert decode_details(trailers(status)) == ErrorDetails(reason, metadata, tuple(violations))


def test_the_error_info_names_the_domain() -> None:
    status = encode_status(code_pb2.NOT_FOUND, "no", Reason.RUN_NOT_FOUND)
    assert len(status.details) == 1  # no BadRequest without violations
    assert ERROR_DOMAIN.encode() in status.details[0].value


def test_calls_without_awp_details_decode_as_empty() -> None:
    assert decode_details(None) == ErrorDetails()
    assert decode_details([]) == ErrorDetails()
    assert decode_details([(STATUS_DETAILS_KEY, b"\xff not a status")]) == ErrorDetails()
    assert decode_details([(STATUS_DETAILS_KEY, "text, not bytes")]) == ErrorDetails()
    assert decode_details(trailers(status_pb2.Status(code=14, message="down"))) == ErrorDetails()
