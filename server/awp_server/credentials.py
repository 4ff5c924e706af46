"""Named credentials with roles, from a file of token hashes (docs/security.md).

The file (YAML or JSON) lists credentials; each has a name, roles, and a token's SHA-256
(hex) or, under mutual TLS, the common name of a client certificate that stands for it.
Several credentials may share a role, so a key is rotated by adding the new one, moving
clients over, then removing the old one. Only hashes are stored: the file is not a
secret. It is re-read when it changes (and on SIGHUP); a file that does not load keeps
the previous credentials and logs why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from awp_protocol.roles import Role, file_entry

log = logging.getLogger("awp.server.credentials")


@dataclass(frozen=True, slots=True)
class Credential:
    name: str
    roles: frozenset[Role]


class CredentialsInvalid(ValueError):
    """The credential set cannot be used; the message names the entry and the problem."""


@dataclass(frozen=True, slots=True)
class CredentialSet:
    by_digest: Mapping[str, Credential] = field(default_factory=dict)
    by_common_name: Mapping[str, Credential] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_digest) + len(self.by_common_name)


def build(entries: Iterable[Mapping[str, Any]], where: str) -> CredentialSet:
    by_digest: dict[str, Credential] = {}
    by_common_name: dict[str, Credential] = {}
    for index, entry in enumerate(entries):
        at = f"{where}: credentials[{index}]"
        if not isinstance(entry, Mapping):
            raise CredentialsInvalid(f"{at}: expected a mapping with name, roles and a token")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise CredentialsInvalid(f"{at}: 'name' is required")
        credential = Credential(name, _roles(entry.get("roles"), f"{at} ({name})"))
        digest, common_name = entry.get("token_sha256"), entry.get("certificate_common_name")
        if (digest is None) == (common_name is None):
            raise CredentialsInvalid(
                f"{at} ({name}): give exactly one of token_sha256 or certificate_common_name"
            )
        if digest is not None:
            if not isinstance(digest, str) or len(digest) != 64:
                raise CredentialsInvalid(f"{at} ({name}): token_sha256 must be 64 hex digits")
            _add(by_digest, digest.lower(), credential, f"{at} ({name}): this token")
        else:
            if not isinstance(common_name, str) or not common_name:
                raise CredentialsInvalid(f"{at} ({name}): certificate_common_name is empty")
            _add(by_common_name, common_name, credential, f"{at} ({name}): this certificate")
    return CredentialSet(by_digest, by_common_name)


def _roles(value: Any, at: str) -> frozenset[Role]:
    known = ", ".join(Role)
    if not isinstance(value, list) or not value:
        raise CredentialsInvalid(f"{at}: 'roles' must be a non-empty list of {known}")
    try:
        return frozenset(Role(role) for role in value)
    except ValueError:
        raise CredentialsInvalid(f"{at}: unknown role in {value!r}; roles are {known}") from None


def _add(table: dict[str, Credential], key: str, credential: Credential, what: str) -> None:
    # One token (or certificate) must mean one thing: two entries for it would make the
    # caller's identity, and so the audit trail, depend on which one wins.
    if key in table and table[key] != credential:
        raise CredentialsInvalid(f"{what} is also credential {table[key].name!r}")
    table[key] = credential


def shorthand(worker_token: str, admin_token: str) -> list[dict[str, Any]]:
    """--worker-token / --admin-token as two credentials named worker and admin."""
    entries = []
    if worker_token:
        entries.append(file_entry("worker", worker_token, [Role.WORKER]))
    if admin_token:
        entries.append(file_entry("admin", admin_token, [Role.ADMIN]))
    return entries


def read_file(path: str) -> list[Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CredentialsInvalid(f"cannot read credentials file {path}: {exc}") from None
    entries = data.get("credentials") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CredentialsInvalid(f"{path}: expected a top-level 'credentials:' list")
    return entries


class CredentialStore:
    """The live credential set; `current()` re-reads the file once it changed."""

    def __init__(self, path: str | None, extra: list[dict[str, Any]]) -> None:
        self._path = path
        self._extra = extra
        self._stamp = self._file_stamp()
        self._set = self._load()

    def _file_stamp(self) -> tuple[int, int] | None:
        if not self._path:
            return None
        try:
            info = os.stat(self._path)
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size)

    def _load(self) -> CredentialSet:
        entries = [*self._extra, *(read_file(self._path) if self._path else [])]
        loaded = build(entries, self._path or "--worker-token/--admin-token")
        if not loaded:
            raise CredentialsInvalid("no credentials: give --credentials-file or tokens")
        return loaded

    def reload(self) -> None:
        try:
            self._set = self._load()
        except CredentialsInvalid as exc:
            log.error("credentials not reloaded, the previous ones stay: %s", exc)
            return
        log.info("credentials reloaded", extra={"credentials": len(self._set)})

    def current(self) -> CredentialSet:
        stamp = self._file_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            self.reload()
        return self._set
