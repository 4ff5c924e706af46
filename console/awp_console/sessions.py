"""Browser sessions: a random id in an HTTP-only cookie, everything else in this process.

A session holds the credential's token (never sent back to the browser, never logged),
who the server says it is, and the synchronizer token its forms must carry. Signing in
replaces the session (a new id and a new form token), so an id planted in a browser
before sign-in is worth nothing after it. Sessions end after an idle period or at
sign-out; the store keeps a bounded number, dropping the least recently used.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from awp_sdk.records import Identity

COOKIE: Final = "awp_console_session"
MAX_SESSIONS: Final = 10_000


@dataclass(slots=True)
class Session:
    id: str = field(repr=False)
    csrf: str = field(repr=False)
    last_used: float
    token: str = field(default="", repr=False)
    # Set once signed in (or on a server without credentials, by the console itself).
    identity: Identity | None = None

    def form_token_ok(self, given: str) -> bool:
        return hmac.compare_digest(self.csrf.encode(), given.encode())


class Sessions:
    def __init__(
        self,
        idle_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        limit: int = MAX_SESSIONS,
    ) -> None:
        self._idle_s = idle_s
        self._clock = clock
        self._limit = limit
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def new(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock())
        self._by_id[session.id] = session
        while len(self._by_id) > self._limit:
            self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id (its idle clock restarted), or None."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used > self._idle_s:
            del self._by_id[session_id]
            return None
        session.last_used = now
        self._by_id.move_to_end(session_id)
        return session

    def sign_in(self, old: Session | None, token: str, identity: Identity) -> Session:
        if old is not None:
            self.drop(old.id)
        session = self.new()
        session.token = token
        session.identity = identity
        return session

    def drop(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)
