"""Settings from flags and AWP_* environment variables: the one way every binary reads them.

A binary's settings are one frozen dataclass. Each field that is a setting carries, in
its metadata (`field(default=..., metadata=flag(...))`), its flag, its environment
variable, how its text is read and its help. `parse` builds the argparse parser from
those fields, so that --help lists every flag with its variable and default, then fills
the dataclass: the flag wins, then the variable, then the field's default. A value is
read by the same function whichever of the two it came from, and a bad one is a usage
error that names the flag (or the variable) and the value. The dataclass's own checks
(`__post_init__` raising ValueError) become usage errors too.

Secrets (`secret=True`) can also come from a file (`--x-file`, `AWP_X_FILE`), so they
need never be on a command line; their fields are declared `repr=False`, and help never
shows their value.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from awp_common import logs
from awp_common.durations import format_duration, parse_duration

C = TypeVar("C")
Reader = Callable[[Any], Any]

_KEY: Final = "awp.flag"
EPILOG: Final = (
    "Every setting is a flag and an AWP_* environment variable (named in its help); "
    "the flag wins over the variable. Durations accept 250ms, 30s, 1m, 1h or seconds."
)
# What _value answers for a setting given nowhere: the dataclass's default applies.
_DEFAULT: Final = object()
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
MAX_PORT: Final = 65535


@dataclass(frozen=True, slots=True)
class Flag:
    """One setting's command-line face; see `flag`."""

    name: str
    env: str
    help: str
    read: Reader = str
    choices: tuple[str, ...] = ()
    shown: str | None = None
    secret: bool = False
    switch: bool = False
    repeat: bool = False
    required: bool = False


def flag(
    name: str,
    env: str,
    help: str,
    *,
    read: Reader = str,
    choices: Sequence[str] = (),
    shown: str | None = None,
    secret: bool = False,
    switch: bool = False,
    repeat: bool = False,
    required: bool = False,
) -> dict[str, Flag]:
    """A dataclass field's metadata that makes it a setting.

    read: text -> value (raises ArgumentTypeError or ValueError); with repeat, the tuple
    of every comma-separated item of every use of the flag (or of the variable) -> value.
    choices: the allowed texts, matched without regard to case. shown: the default as
    help prints it, where the field's default is computed. switch: a flag without a
    value (the variable says 1/true/yes or 0/false/no). required: empty is an error.
    """
    return {
        _KEY: Flag(name, env, help, read, tuple(choices), shown, secret, switch, repeat, required)
    }


def flags_of(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The settings of a settings dataclass, in declaration (and --help) order."""
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(cls) if _KEY in f.metadata]


# Settings several binaries share: `field(default=..., metadata=flags.LOG_FORMAT)`.
# A URL may carry a password: secret, so it can come from a file and is never echoed.
DATABASE_URL: Final = flag(
    "--database-url", "AWP_DATABASE_URL", "PostgreSQL URL", required=True, secret=True
)
LOG_FORMAT: Final = flag(
    "--log-format", "AWP_LOG_FORMAT", "log lines as JSON or text", choices=logs.FORMATS
)
LOG_LEVEL: Final = flag(
    "--log-level", "AWP_LOG_LEVEL", "least severe level logged", choices=logs.LEVELS
)


def metrics_listen(env: str, shown: str | None = None) -> dict[str, Flag]:
    """--metrics-listen, in every binary; each process its own variable, so that one
    environment shared by several processes does not make them all bind one port."""
    return flag(
        "--metrics-listen",
        env,
        "Prometheus /metrics HOST:PORT, or 'off'",
        read=address_or_off,
        shown=shown,
    )


def db_stall_timeout(shown: str | None = None) -> dict[str, Flag]:
    """--db-stall-timeout: one variable for every process (docs/liveness.md)."""
    return flag(
        "--db-stall-timeout",
        "AWP_DB_STALL_TIMEOUT",
        "how long a session may sit idle inside a transaction before PostgreSQL ends it; "
        "lock waits may last twice, statements three times as long",
        read=positive_duration,
        shown=shown,
    )


# ---------------------------------------------------------------- readers


def duration(text: str) -> float:
    """Seconds, from "250ms", "30s", "1m", "1h" or a number of seconds; >= 0."""
    try:
        return parse_duration(text, numeric_text=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return seconds


_DURATIONS: Final = (duration, positive_duration)


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def whole(low: int, high: int | None = None) -> Reader:
    """A whole number from low (to high)."""

    def read(text: str) -> int:
        value = integer(text)
        _check_range(value, low, high, text)
        return value

    return read


def number(low: float, high: float | None = None) -> Reader:
    """A number from low (to high)."""

    def read(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        _check_range(value, low, high, text)
        return value

    return read


def _check_range(value: float, low: float, high: float | None, text: str) -> None:
    if high is not None and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {low:g} to {high:g}, got {text}")
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if int(port) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"port must be 0 to {MAX_PORT}, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(listen: str) -> bool:
    """Whether HOST:PORT is reachable only from this machine."""
    host, _ = host_port(listen)
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def address(text: str) -> str:
    """HOST:PORT, kept as written."""
    host_port(text)
    return text


def address_or_off(text: str) -> str | None:
    """HOST:PORT, or None for "off" (or empty): a listener that is not started."""
    return None if text.strip().lower() in ("", "off") else address(text)


def items(text: str) -> tuple[str, ...]:
    """Comma-separated items, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE | _FALSE:
        return word in _TRUE
    raise argparse.ArgumentTypeError(f"expected 1/true/yes or 0/false/no, got {text!r}")


# ---------------------------------------------------------------- parsing


def parse(
    cls: type[C],
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    prog: str,
    description: str,
    check: Callable[[C], None] | None = None,
) -> C:
    """cls filled from argv and the environment; exits 2 with a usage error on a bad value.

    check: start-up rules beyond the dataclass's own (ValueError: a usage error).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=EPILOG)
    add_flags(parser, cls)
    return settings(cls, parser, parser.parse_args(argv), environ, check)


def add_flags(parser: argparse.ArgumentParser, cls: type[Any], *, suppress: bool = False) -> None:
    """Adds cls's flags to parser. suppress: a flag not given leaves the namespace alone
    (for the copy on a subcommand of a flag the main parser also takes)."""
    unset = argparse.SUPPRESS if suppress else None
    for field, spec in flags_of(cls):
        options: dict[str, Any] = {"dest": field.name, "default": unset}
        if spec.switch:
            options["action"] = "store_true"
        elif spec.repeat:
            options["action"] = "append"
        if spec.choices:
            options["metavar"] = "{" + ",".join(spec.choices) + "}"
        elif not spec.switch:
            named = spec.name.removeprefix("--").upper().replace("-", "_")
            options["metavar"] = "DURATION" if spec.read in _DURATIONS else named
        parser.add_argument(spec.name, help=_help(field, spec), **options)
        if spec.secret:
            parser.add_argument(
                f"{spec.name}-file",
                dest=f"{field.name}_file",
                default=unset,
                metavar="PATH",
                help=f"read {spec.name} from this file (env {spec.env}_FILE)",
            )


def settings(
    cls: type[C],
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    check: Callable[[C], None] | None = None,
) -> C:
    """cls from parsed args, the environment (os.environ by default) and its defaults."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    try:
        for field, spec in flags_of(cls):
            found = _value(field.name, spec, args, env)
            if found is not _DEFAULT:
                values[field.name] = found
        config = cls(**values)
        if check is not None:
            check(config)
        return config
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(str(exc))


def _value(dest: str, spec: Flag, args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    given = getattr(args, dest, None)
    if given is not None:
        return True if spec.switch else _read(spec, given, f"argument {spec.name}")
    path = getattr(args, f"{dest}_file", None) if spec.secret else None
    if path is not None:
        return read_secret_file(path, f"argument {spec.name}-file")
    raw = env.get(spec.env, "")
    if raw:
        where = f"{spec.env}={raw!r} (for {spec.name})"
        if spec.secret:
            where = f"{spec.env} (for {spec.name})"
        return _read(spec, [raw] if spec.repeat else raw, where)
    path = env.get(f"{spec.env}_FILE", "") if spec.secret else ""
    if path:
        return read_secret_file(path, f"{spec.env}_FILE")
    if spec.required:
        raise ValueError(f"{spec.name} (or {spec.env}) is required")
    return _DEFAULT


def _read(spec: Flag, given: Any, where: str) -> Any:
    try:
        if spec.switch:
            return _switch(given)
        if spec.repeat:
            return spec.read(tuple(item for text in given for item in items(text)))
        if spec.choices:
            given = _choice(spec.choices, given)
        return spec.read(given)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _choice(choices: tuple[str, ...], text: str) -> str:
    for choice in choices:
        if choice.lower() == text.strip().lower():
            return choice
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(choices)})")


def read_secret_file(path: str, where: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read {path}: {exc.strerror}") from None


def _help(field: dataclasses.Field[Any], spec: Flag) -> str:
    notes = [f"env {spec.env}"]
    if spec.secret:
        notes.append(f"or a file: {spec.name}-file / {spec.env}_FILE")
    shown = spec.shown if spec.shown is not None else _shown(field, spec)
    if shown:
        notes.append(f"default {shown}")
    # argparse %-formats help text.
    return f"{spec.help} ({'; '.join(notes)})".replace("%", "%%")


def _shown(field: dataclasses.Field[Any], spec: Flag) -> str:
    default = field.default
    if spec.secret or default in (dataclasses.MISSING, None) or default is False:
        return ""
    if isinstance(default, str | tuple) and not default:
        return ""
    if spec.read in _DURATIONS:
        return format_duration(default)
    if isinstance(default, tuple):
        return ",".join(default)
    return f"{default:g}" if isinstance(default, float) else str(default)
