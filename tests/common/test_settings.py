"""Every binary's settings, read one way (awp_common.flags): --help names each flag with
its environment variable, a variable is read exactly like its flag, bad durations are
errors that name the flag (or the variable) and the value, secrets come from files and
never show, and the docs list every setting."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from awp_cli.main import build_parser
from awp_cli.main import run as awp
from awp_common import flags
from awp_common.durations import format_duration
from awp_coordinator.config import CoordinatorConfig
from awp_coordinator.config import parse as coordinator_parse
from awp_sdk.connection import Connection as Target
from awp_server.config import ServerConfig
from awp_server.config import parse as server_parse
from awp_worker._config import WorkerConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]
Parse = Callable[[Sequence[str], Mapping[str, str]], Any]


def target(argv: Sequence[str], environ: Mapping[str, str]) -> Target:
    """The awp CLI's settings, exactly as `awp stats` would read them."""
    parser = build_parser()
    return flags.settings(Target, parser, parser.parse_args([*argv, "stats"]), environ)


# Each binary: its settings class, how it parses, and what every parse here needs.
BINARIES: dict[str, tuple[type[Any], Parse, list[str]]] = {
    "awp-server": (
        ServerConfig,
        server_parse,
        ["--database-url", "postgresql://db/awp", "--insecure"],
    ),
    "awp-coordinator": (
        CoordinatorConfig,
        coordinator_parse,
        ["--database-url", "postgresql://db/awp"],
    ),
    "awp-worker": (WorkerConfig, parse_config, []),
    "awp": (Target, target, []),
}
HELP: dict[str, Callable[[], object]] = {
    "awp-server": lambda: server_parse(["--help"], {}),
    "awp-coordinator": lambda: coordinator_parse(["--help"], {}),
    "awp-worker": lambda: parse_config(["--help"], {}),
    "awp": lambda: awp(["--help"]),
}
DOCS = {
    "awp-server": "docs/configuration.md",
    "awp-coordinator": "docs/configuration.md",
    "awp-worker": "worker/README.md",
    "awp": "docs/cli.md",
}


def durations(cls: type[Any]) -> list[tuple[str, flags.Flag, float]]:
    """(field, flag, a valid value other than the default) of every duration setting."""
    found = []
    for field, spec in flags.flags_of(cls):
        if spec.read in (flags.duration, flags.positive_duration):
            default = field.default
            found.append((field.name, spec, 2 * default if default else 1.5))
    return found


@pytest.mark.parametrize("binary", BINARIES)
def test_help_lists_every_flag_with_its_variable(
    binary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cls, _, _ = BINARIES[binary]
    with pytest.raises(SystemExit) as exited:
        HELP[binary]()
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    for _, spec in flags.flags_of(cls):
        assert spec.name in text and f"env {spec.env}" in text, spec
        if spec.secret:
            assert f"{spec.name}-file" in text and f"{spec.env}_FILE" in text, spec


@pytest.mark.parametrize("binary", BINARIES)
def test_every_setting_is_documented(binary: str) -> None:
    cls, _, _ = BINARIES[binary]
    text = (ROOT / DOCS[binary]).read_text()
    missing = [
        spec.name
        for _, spec in flags.flags_of(cls)
        if f"`{spec.name}" not in text or f"`{spec.env}`" not in text
    ]
    assert not missing, f"{DOCS[binary]} lacks {missing}"


@pytest.mark.parametrize("binary", BINARIES)
def test_a_variable_reads_exactly_like_its_flag(binary: str) -> None:
    cls, parse, base = BINARIES[binary]
    for name, spec, seconds in durations(cls):
        for text in (format_duration(seconds), f"{seconds:g}"):
            by_flag = parse([*base, spec.name, text], {})
            by_env = parse(base, {spec.env: text})
            assert getattr(by_flag, name) == getattr(by_env, name) == pytest.approx(seconds)


@pytest.mark.parametrize("binary", BINARIES)
def test_a_bad_duration_names_the_flag_or_variable_and_the_value(
    binary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cls, parse, base = BINARIES[binary]
    assert durations(cls), "every binary has duration settings"
    for _, spec, _ in durations(cls):
        for argv, env, where in (
            ([*base, spec.name, "5 minutes"], {}, f"argument {spec.name}: "),
            (base, {spec.env: "5 minutes"}, f"{spec.env}='5 minutes' (for {spec.name}): "),
        ):
            with pytest.raises(SystemExit) as exited:
                parse(argv, env)
            assert exited.value.code == 2
            error = capsys.readouterr().err
            assert f"{where}expected a duration" in error and "got '5 minutes'" in error


def test_the_flag_wins_and_the_environment_beats_the_default() -> None:
    env = {"AWP_WORKER_CONCURRENCY": "9", "AWP_WORKER_CLAIM_BACKOFF_MAX": "1m"}
    assert parse_config(["--concurrency", "3"], env).concurrency == 3
    assert parse_config([], env).claim_backoff_max == 60.0
    assert parse_config([], {}).claim_backoff_max == 5.0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--log-format", "xml"], {}, "argument --log-format: invalid choice: 'xml'"),
        ([], {"AWP_LOG_FORMAT": "xml"}, "AWP_LOG_FORMAT='xml' (for --log-format): invalid"),
        ([], {"AWP_WORKER_CONCURRENCY": "many"}, "expected a whole number, got 'many'"),
        ([], {"AWP_TLS": "maybe"}, "AWP_TLS='maybe' (for --tls): expected 1/true/yes"),
        ([], {"AWP_WORKER_LABELS": "zone"}, "label 'zone' is not key=value"),
        (["--claim-backoff-max", "100ms"], {}, "claim backoff maximum must be >= its initial"),
    ],
)
def test_other_bad_values_are_usage_errors_that_say_where(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv, env)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_levels_and_switches_read_the_same_from_either_side() -> None:
    assert parse_config(["--log-level", "DEBUG"], {}).log_level == "debug"
    assert parse_config([], {"AWP_LOG_LEVEL": "Warning"}).log_level == "warning"
    assert parse_config([], {"AWP_TLS": "yes"}).tls and parse_config(["--tls"], {}).tls
    assert not parse_config([], {"AWP_TLS": "0"}).tls
    assert parse_config(["--tls-ca-file", "ca.pem"], {}).tls  # a CA implies TLS


def test_secrets_come_from_files_and_never_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-from-file\n")
    server = server_parse(
        ["--database-url", "x", "--worker-token-file", str(token)],
        {"AWP_ADMIN_TOKEN_FILE": str(token)},
    )
    assert server.worker_token == server.admin_token == "s3cret-from-file"
    assert "s3cret" not in repr(server)
    assert (
        parse_config([], {"AWP_WORKER_TOKEN_FILE": str(token)}).worker_token == "s3cret-from-file"
    )
    # A file named on the command line wins over the variable, as any flag does.
    assert target(["--token-file", str(token)], {"AWP_TOKEN": "other"}).token == "s3cret-from-file"
    assert target([], {"AWP_TOKEN": "other"}).token == "other"
    assert target([], {"AWP_TOKEN_FILE": str(token)}).token == "s3cret-from-file"
    # A variable's secret is never echoed back in an error.
    with pytest.raises(SystemExit):
        server_parse(["--database-url", "x"], {"AWP_WORKER_TOKEN_FILE": str(tmp_path / "no")})
    error = capsys.readouterr().err
    assert f"AWP_WORKER_TOKEN_FILE: cannot read {tmp_path / 'no'}" in error
    for cls in (ServerConfig, WorkerConfig, Target):
        for field, spec in flags.flags_of(cls):
            assert not spec.secret or not field.repr, f"{cls.__name__}.{field.name} in repr"


def test_every_setting_has_a_flag_and_a_unique_variable() -> None:
    for binary, (cls, _, _) in BINARIES.items():
        specs = [spec for _, spec in flags.flags_of(cls)]
        flagged = {field.name for field, _ in flags.flags_of(cls)}
        no_flag = [f.name for f in dataclasses.fields(cls) if f.name not in flagged]
        assert not no_flag, f"{binary}: settings without a flag: {no_flag}"
        assert len({s.env for s in specs}) == len(specs), binary
        assert all(s.env.startswith("AWP_") for s in specs), binary


def test_a_flag_given_before_or_after_the_command_is_read_once() -> None:
    parser = build_parser()
    for argv in (["--timeout", "250ms", "stats"], ["stats", "--timeout", "250ms"]):
        args: argparse.Namespace = parser.parse_args(argv)
        assert flags.settings(Target, parser, args, {"AWP_TIMEOUT": "9"}).timeout == 0.25
    assert target([], {"AWP_TIMEOUT": "9"}).timeout == 9.0


# The processes' parsers, walked for the settings they share (issue 26.3). A setting is
# named by its field (a trailing _s, for seconds, aside); one it has in several processes
# must be spelled one way in all of them.
PROCESSES = ("awp-server", "awp-coordinator", "awp-worker")
# A process's own variable for a shared setting, where one environment serving several
# processes must not give them one value (a metrics port, a pool size, a drain's grace):
# the shared variable's name with the process's prefix.
OWN_PREFIX = {
    "awp-server": "AWP_",
    "awp-coordinator": "AWP_COORDINATOR_",
    "awp-worker": "AWP_WORKER_",
}
_SAME_READING = ("choices", "secret", "switch", "repeat")


def _reader(spec: flags.Flag) -> str:
    """What kind of text a flag takes; its bounds may differ by process (a pool of at
    least 1, a drain of 0 s), as whole(low) and positive_duration say."""
    read = flags.duration if spec.read is flags.positive_duration else spec.read
    return f"{read.__module__}.{read.__qualname__}"


def divergences(parsers: Mapping[str, type[Any]]) -> list[str]:
    """Every shared setting spelled two ways across these processes' settings classes."""
    found: list[str] = []
    settings = [
        (binary, field.name.removesuffix("_s"), spec)
        for binary, cls in parsers.items()
        for field, spec in flags.flags_of(cls)
    ]
    for binary, _, spec in settings:
        # An address is one HOST:PORT|off setting, as every process's listeners are.
        if spec.name.endswith(("-port", "-host")):
            found.append(f"{binary} {spec.name}: an address is one HOST:PORT flag, --*-listen")
    for i, (binary, name, spec) in enumerate(settings):
        for other, other_name, other_spec in settings[i + 1 :]:
            if other == binary:
                continue
            where = (
                f"{binary} {spec.name} ({spec.env}) vs {other} {other_spec.name} ({other_spec.env})"
            )
            if spec.env == other_spec.env and spec.name != other_spec.name:
                found.append(f"one variable, two flags: {where}")
            if name == other_name and spec.name != other_spec.name:
                found.append(f"one setting, two flags: {where}")
            if spec.name != other_spec.name:
                continue
            if name != other_name:
                found.append(f"one flag, two settings ({name}, {other_name}): {where}")
            own = spec.env.removeprefix(OWN_PREFIX[binary])
            other_own = other_spec.env.removeprefix(OWN_PREFIX[other])
            if spec.env != other_spec.env and own != other_own:
                found.append(f"one flag, unrelated variables: {where}")
            if _reader(spec) != _reader(other_spec):
                found.append(f"one flag read two ways (read): {where}")
            for part in _SAME_READING:
                if getattr(spec, part) != getattr(other_spec, part):
                    found.append(f"one flag read two ways ({part}): {where}")
    return found


def test_a_setting_shared_by_the_processes_is_spelled_one_way() -> None:
    assert divergences({binary: BINARIES[binary][0] for binary in PROCESSES}) == []


@dataclass(frozen=True)
class _OldServer:
    metrics_listen: str | None = dataclasses.field(
        default=None, metadata=flags.metrics_listen("AWP_ML")
    )
    worker_token: str = dataclasses.field(
        default="", metadata=flags.flag("--worker-token", "AWP_WORKER_TOKEN", "t", secret=True)
    )
    shutdown_grace_s: float = dataclasses.field(
        default=1.0,
        metadata=flags.flag("--shutdown-grace", "AWP_SHUTDOWN_GRACE", "g", read=flags.duration),
    )


@dataclass(frozen=True)
class _OldWorker:
    """The worker's settings before issue 26.3, against the server's."""

    metrics_port: int = dataclasses.field(
        default=0, metadata=flags.flag("--metrics-port", "AWP_WORKER_METRICS_PORT", "p")
    )
    token: str = dataclasses.field(
        default="", metadata=flags.flag("--token", "AWP_WORKER_TOKEN", "t", secret=True)
    )
    shutdown_grace: float = dataclasses.field(
        default=1.0,
        metadata=flags.flag(
            "--shutdown-timeout", "AWP_WORKER_SHUTDOWN_TIMEOUT", "g", read=flags.duration
        ),
    )
    drain: float = dataclasses.field(
        default=1.0,
        metadata=flags.flag("--shutdown-grace", "AWP_DRAIN", "d", read=flags.integer),
    )


def test_the_walk_finds_a_setting_spelled_two_ways() -> None:
    found = divergences({"awp-server": _OldServer, "awp-worker": _OldWorker})
    assert len(found) == 6, found
    assert "awp-worker --metrics-port: an address is one HOST:PORT flag, --*-listen" in found
    assert any(f.startswith("one variable, two flags: awp-server --worker-token") for f in found)
    assert any(f.startswith("one setting, two flags: awp-server --shutdown-grace") for f in found)
    assert any(f.startswith("one flag, two settings (shutdown_grace, drain)") for f in found)
    assert any(f.startswith("one flag, unrelated variables") for f in found)
    assert any(f.startswith("one flag read two ways (read)") for f in found)
