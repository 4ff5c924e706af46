"""Pure pieces of the worker: backoff, lease deadline arithmetic, error classification,
configuration, structured logging. No server, no network."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random

import grpc
import pytest

from awp_common.logs import JsonFormatter
from awp_protocol.errors import STATUS_DETAILS_KEY, Reason, encode_status
from awp_worker._backoff import Backoff
from awp_worker._config import WorkerConfig, parse_config
from awp_worker._errors import Kind, classify, describe, error_reason, is_transient
from awp_worker._lease import LeaseClock
from awp_worker._logging import ContextFilter, LeaseLog, bind, unbind

# --- backoff --------------------------------------------------------------------------


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    backoff = Backoff(0.25, 5.0, jitter=0.0)
    assert [backoff.next() for _ in range(8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_backoff_jitter_stays_within_the_band_below_the_base() -> None:
    backoff = Backoff(1.0, 1.0, jitter=0.5, rng=random.Random(7))
    delays = [backoff.next() for _ in range(200)]
    assert all(0.5 <= d <= 1.0 for d in delays)
    assert len(set(delays)) > 100  # actually random


def test_backoff_resets_after_success() -> None:
    backoff = Backoff(0.25, 5.0, jitter=0.0)
    for _ in range(5):
        backoff.next()
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.failures == 0 and backoff.next() == 0.25


def test_backoff_survives_a_very_long_outage() -> None:
    backoff = Backoff(0.05, 2.0, jitter=0.0)
    for _ in range(10_000):
        delay = backoff.next()
    assert delay == 2.0


@pytest.mark.parametrize(
    ("initial", "maximum", "kwargs"),
    [(0, 1, {}), (2, 1, {}), (1, 2, {"multiplier": 0.5}), (1, 2, {"jitter": 1.5})],
)
def test_backoff_rejects_nonsense(initial: float, maximum: float, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum, **kwargs)


# --- lease deadlines ------------------------------------------------------------------


def test_safety_deadline_is_the_earlier_remaining_minus_the_margin() -> None:
    clock = LeaseClock.start(100.0, lease_remaining=15.0, attempt_remaining=60.0, safety_margin=1.0)
    assert clock.safety_deadline == 114.0
    assert clock.attempt_safety_deadline == 159.0
    clock = LeaseClock.start(100.0, lease_remaining=15.0, attempt_remaining=5.0, safety_margin=1.0)
    assert clock.safety_deadline == 104.0


def test_renewal_extends_from_the_time_of_the_answer() -> None:
    clock = LeaseClock.start(100.0, 15.0, 60.0, 1.0)
    assert clock.renew(105.0, 15.0, 55.0) == 119.0
    assert not clock.expired(118.9) and clock.expired(119.0)


def test_renewal_never_passes_the_attempt_deadline() -> None:
    clock = LeaseClock.start(100.0, 15.0, 20.0, 1.0)
    assert clock.renew(110.0, 15.0, None) == 119.0  # attempt deadline 120 - margin
    # A later, tighter estimate of the attempt deadline wins; a looser one does not.
    assert clock.renew(111.0, 15.0, 5.0) == 115.0
    assert clock.renew(112.0, 15.0, 30.0) == 115.0


def test_a_renewal_with_less_time_shortens_the_deadline() -> None:
    clock = LeaseClock.start(100.0, 15.0, 60.0, 1.0)
    assert clock.renew(101.0, 1.0, 59.0) == 101.0  # e.g. the server shortened it


def test_a_short_window_keeps_at_least_half_of_it() -> None:
    # A task with a 1 s timeout would never run under a 1 s margin.
    clock = LeaseClock.start(0.0, lease_remaining=15.0, attempt_remaining=1.0, safety_margin=1.0)
    assert clock.margin == 0.5 and clock.safety_deadline == 0.5


# --- errors ---------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, reason: str = "", details: str = "d") -> None:
        self._code, self._details = code, details
        self._metadata: tuple[tuple[str, bytes], ...] = ()
        if reason:
            status = encode_status(code.value[0], details, Reason(reason))
            self._metadata = ((STATUS_DETAILS_KEY, status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._metadata


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, "", Kind.TRANSIENT),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", Kind.TRANSIENT),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "", Kind.TRANSIENT),
        (grpc.StatusCode.INTERNAL, "", Kind.TRANSIENT),
        (grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID", Kind.PERMANENT),
        (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID", Kind.PERMANENT),
        (grpc.StatusCode.UNAUTHENTICATED, "", Kind.PERMANENT),
        (grpc.StatusCode.FAILED_PRECONDITION, "PROTOCOL_UNSUPPORTED", Kind.PERMANENT),
        (grpc.StatusCode.FAILED_PRECONDITION, "WORKER_DRAINING", Kind.REJECTED),
        (grpc.StatusCode.INVALID_ARGUMENT, "", Kind.REJECTED),
    ],
)
def test_errors_are_classified_by_code_and_reason(
    code: grpc.StatusCode, reason: str, kind: Kind
) -> None:
    assert classify(FakeRpcError(code, reason)) is kind


def test_error_reason_and_description_come_from_error_info() -> None:
    error = FakeRpcError(grpc.StatusCode.UNAUTHENTICATED, "SESSION_INVALID", "gone")
    assert error_reason(error) == "SESSION_INVALID"
    assert describe(error) == "UNAUTHENTICATED [SESSION_INVALID]: gone"
    assert error_reason(FakeRpcError(grpc.StatusCode.UNAVAILABLE)) is None
    assert classify(TimeoutError()) is Kind.TRANSIENT


def test_cancellation_is_never_transient() -> None:
    # tenacity hands BaseExceptions to the retry predicate too.
    assert not is_transient(asyncio.CancelledError())
    assert is_transient(FakeRpcError(grpc.StatusCode.UNAVAILABLE))
    assert not is_transient(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT))


# --- configuration --------------------------------------------------------------------


def test_environment_variables_configure_everything() -> None:
    config = parse_config(
        [],
        {
            "AWP_SERVER": "h:1",
            "AWP_WORKER_TOKEN": "secret",
            "AWP_WORKER_NAME": "n1",
            "AWP_WORKER_KINDS": "python, mock",
            "AWP_WORKER_CONCURRENCY": "16",
            "AWP_WORKER_MODULE": "a.b,c",
            "AWP_WORKER_SHUTDOWN_GRACE": "7",
            "AWP_WORKER_SAFETY_MARGIN": "0.5",
            "AWP_WORKER_METRICS_LISTEN": "0.0.0.0:9464",
            "AWP_LOG_FORMAT": "text",
            "AWP_WORKER_LABELS": "zone=a,tier=gpu",
            "AWP_WORKER_MODELS": "llama3-8b,qwen",
            "AWP_WORKER_RESOURCES": "gpu=2,vram_gb=80",
        },
    )
    assert (config.server, config.worker_token, config.name) == ("h:1", "secret", "n1")
    assert config.kinds == ("python", "mock") and config.concurrency == 16
    assert config.modules == ("a.b", "c")
    assert (config.shutdown_grace, config.safety_margin) == (7.0, 0.5)
    assert config.metrics_listen == "0.0.0.0:9464" and config.log_format == "text"
    assert dict(config.labels) == {"zone": "a", "tier": "gpu"}
    assert config.models == ("llama3-8b", "qwen")
    assert dict(config.resources) == {"gpu": 2, "vram_gb": 80}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--label", "a=1", "--label", "a=2"], "label key 'a' is given twice"),
        (["--resource", "gpu"], "resource 'gpu' is not name=units"),
        (["--resource", "gpu=2", "--resource", "gpu=3"], "resource 'gpu' is given twice"),
        (["--resource", "gpu=0"], "--resource: resource 'gpu': capacity must be"),
        (["--model", "a=b"], "--model: 'a=b' is not a model name"),
    ],
)
def test_placement_flags_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, {})
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_win_over_the_environment() -> None:
    config = parse_config(
        ["--server", "f:2", "--concurrency", "3", "--module", "x", "--module", "y"],
        {"AWP_SERVER": "e:1", "AWP_WORKER_CONCURRENCY": "9", "AWP_WORKER_MODULE": "z"},
    )
    assert (config.server, config.concurrency, config.modules) == ("f:2", 3, ("x", "y"))


def test_several_servers_in_order() -> None:
    config = parse_config(["--server", "a:1, b:2,,c:3"], {})
    assert config.servers == ("a:1", "b:2", "c:3")
    assert parse_config([], {}).servers == ("127.0.0.1:50051",)
    # A host alone means the default port, as for the CLI and the SDK (gRPC would dial 443).
    assert parse_config(["--server", "db1,[::1],b:2"], {}).servers == (
        "db1:50051",
        "[::1]:50051",
        "b:2",
    )
    for wrong in (",", "a:1,a:1", "a,a:50051", "a:port"):
        with pytest.raises(ValueError, match="server address"):
            WorkerConfig(server=wrong)


def test_defaults() -> None:
    config = parse_config([], {})
    assert config.server == "127.0.0.1:50051" and config.worker_token == ""
    assert config.kinds == ("mock", "python") and config.concurrency == 8
    assert config.metrics_listen is None and config.log_format == "json"
    assert config.shutdown_grace == 30.0 and config.safety_margin == 1.0
    assert config.name  # host name and pid


@pytest.mark.parametrize(
    "argv",
    [["--concurrency", "0"], ["--concurrency", "x"], ["--kinds", ""], ["--kinds", "Mock!"],
     ["--label", "novalue"], ["--metrics-listen", "127.0.0.1:70000"],
     ["--metrics-listen", "9464"], ["--kinds", "mock,mock"]],
)  # fmt: skip
def test_bad_values_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, {})
    assert exit_info.value.code == 2


def test_the_token_never_shows_in_the_config_repr() -> None:
    assert "s3cret" not in repr(WorkerConfig(worker_token="s3cret"))


# --- logging --------------------------------------------------------------------------


def _json_logger() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("awp_worker.test-logging")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def test_bound_fields_and_lease_fields_appear_on_json_lines() -> None:
    logger, stream = _json_logger()
    token = bind(worker_id="w-1")
    try:
        logger.info("plain")
        LeaseLog(logger, {"run_id": "r", "task_key": "t", "attempt": 2}).warning("about a lease")
    finally:
        unbind(token)
    logger.info("after")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["msg"] == "plain" and lines[0]["worker_id"] == "w-1"
    assert lines[1]["level"] == "warning"
    assert {k: lines[1][k] for k in ("run_id", "task_key", "attempt", "worker_id")} == {
        "run_id": "r",
        "task_key": "t",
        "attempt": 2,
        "worker_id": "w-1",
    }
    assert "worker_id" not in lines[2]


def test_a_claim_wait_the_server_would_refuse_is_a_usage_error() -> None:
    # The server refuses a Claim.wait above MAX_CLAIM_WAIT_MS (5 minutes).
    assert parse_config(["--claim-wait", "5m"], {}).claim_wait == 300
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--claim-wait", "6m"], {})
    assert exit_info.value.code == 2
