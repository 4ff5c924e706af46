"""Secrets handed to workers (session and lease tokens): only their digests are stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_token() -> str:
    return secrets.token_urlsafe(32)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def matches(token: str, stored_digest: bytes | None) -> bool:
    """Constant-time: the comparison does not reveal how much of a digest matched."""
    if stored_digest is None:
        return False
    return hmac.compare_digest(digest(token), stored_digest)
