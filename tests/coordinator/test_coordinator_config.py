"""Flags and AWP_* environment variables of awp-coordinator."""

from __future__ import annotations

import pytest

from awp_coordinator.config import OFFLINE_AFTER_INTERVALS, parse
from awp_db.workers import OfflineRule


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AWP_DATABASE_URL",
        "AWP_SCAN_INTERVAL",
        "AWP_HEARTBEAT_INTERVAL",
        "AWP_OFFLINE_AFTER",
        "AWP_GLOBAL_DISPATCH_LIMIT",
        "AWP_COORDINATOR_METRICS_LISTEN",
        "AWP_LOG_FORMAT",
    ):
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    config = parse(["--database-url", "postgresql://db/awp"])
    assert config.database_url == "postgresql://db/awp"
    assert config.scan_interval_s == 1.0
    # No interval of its own: 3 of each session's intervals, which the servers set.
    assert config.offline_rule == OfflineRule(intervals=3, floor_ms=0)
    assert config.global_dispatch_limit == 10_000
    assert config.metrics_listen == "127.0.0.1:9465"
    assert config.log_format == "json"


def test_environment_supplies_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWP_DATABASE_URL", "postgresql://env/awp")
    monkeypatch.setenv("AWP_SCAN_INTERVAL", "0.25")
    monkeypatch.setenv("AWP_OFFLINE_AFTER", "1m")
    monkeypatch.setenv("AWP_GLOBAL_DISPATCH_LIMIT", "0")
    monkeypatch.setenv("AWP_COORDINATOR_METRICS_LISTEN", "off")
    monkeypatch.setenv("AWP_LOG_FORMAT", "text")
    config = parse([])
    assert config.database_url == "postgresql://env/awp"
    assert config.scan_interval_s == 0.25
    assert config.offline_rule == OfflineRule(OFFLINE_AFTER_INTERVALS, floor_ms=60_000)
    assert config.global_dispatch_limit == 0  # unlimited
    assert config.metrics_listen is None
    assert config.log_format == "text"


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWP_DATABASE_URL", "postgresql://env/awp")
    monkeypatch.setenv("AWP_OFFLINE_AFTER", "30")
    config = parse(["--database-url", "postgresql://flag/awp", "--offline-after", "12"])
    assert config.database_url == "postgresql://flag/awp"
    assert config.offline_rule.floor_ms == 12_000


def test_the_servers_heartbeat_interval_is_not_a_coordinator_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A shared environment may well set it for the servers: the coordinator ignores it.
    monkeypatch.setenv("AWP_HEARTBEAT_INTERVAL", "2")
    assert parse(["--database-url", "x"]).offline_rule.floor_ms == 0
    with pytest.raises(SystemExit):
        parse(["--database-url", "x", "--heartbeat-interval", "2"])
    assert "unrecognized arguments: --heartbeat-interval" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--database-url (or AWP_DATABASE_URL) is required"),
        (["--database-url", "x", "--scan-interval", "0"], "must be > 0"),
        (["--database-url", "x", "--global-dispatch-limit", "-1"], "must be >= 0"),
        (["--database-url", "x", "--offline-after", "4x"], "argument --offline-after: expected"),
        (["--database-url", "x", "--offline-after", "0s"], "must be > 0, got '0s'"),
        (["--database-url", "x", "--metrics-listen", "nowhere"], "HOST:PORT"),
        (["--database-url", "x", "--log-format", "xml"], "invalid choice"),
    ],
)
def test_bad_settings_are_clear_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_leader_lease_lasts_one_and_a_half_scan_intervals_unless_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWP_LEADER_TTL", raising=False)
    assert parse(["--database-url", "x"]).leader_ttl == 1.5
    assert parse(["--database-url", "x", "--scan-interval", "250ms"]).leader_ttl == 0.375
    monkeypatch.setenv("AWP_LEADER_TTL", "10s")
    assert parse(["--database-url", "x", "--scan-interval", "250ms"]).leader_ttl == 10.0
    assert parse(["--database-url", "x", "--leader-ttl", "3"]).leader_ttl == 3.0
    with pytest.raises(SystemExit):
        parse(["--database-url", "x", "--leader-ttl", "0s"])
    assert "must be > 0, got '0s'" in capsys.readouterr().err
