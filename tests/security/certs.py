"""Certificates made in the test (trustme), written as the PEM files the flags take."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trustme

LOOPBACK = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Pem:
    cert: str
    key: str


def write_ca(ca: trustme.CA, path: Path) -> str:
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def write_leaf(leaf: trustme.LeafCert, directory: Path, name: str) -> Pem:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    for extra in leaf.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    return Pem(str(cert), str(key))


def server_leaf(ca: trustme.CA, directory: Path, name: str = "server") -> Pem:
    return write_leaf(ca.issue_cert(*LOOPBACK), directory, name)


def client_leaf(
    ca: trustme.CA, directory: Path, name: str = "client", *, expired: bool = False
) -> Pem:
    now = datetime.now(UTC)
    leaf = ca.issue_cert(
        f"{name}.clients.awp.test",
        common_name=name,
        not_before=now - timedelta(days=2) if expired else None,
        not_after=now - timedelta(days=1) if expired else None,
    )
    return write_leaf(leaf, directory, name)
