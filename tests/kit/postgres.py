"""The test session's PostgreSQL server and how to name a database on it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from awp_db.embedded import EmbeddedPostgres


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass
class PostgresHandle:
    """The session's server: `admin_dsn` reaches the maintenance database."""

    admin_dsn: str
    embedded: EmbeddedPostgres | None

    def dsn(self, database: str) -> str:
        return with_database(self.admin_dsn, database)
