"""The database settings of every process that reaches PostgreSQL itself (awp-server,
awp-coordinator): metadata for their settings dataclasses (awp_common.flags), and the
rule that ties them together. docs/postgres.md explains them."""

from __future__ import annotations

from typing import Final

from awp_common.flags import flag
from awp_db.connect import PoolMode

SESSION_DATABASE_URL: Final = flag(
    "--session-database-url",
    "AWP_SESSION_DATABASE_URL",
    "PostgreSQL URL for the connections that need a session of their own (LISTEN, "
    "migrations): PostgreSQL itself or a session-mode pool, when --database-url is a "
    "transaction pooler",
    shown="--database-url",
    secret=True,
)
DATABASE_POOL_MODE: Final = flag(
    "--database-pool-mode",
    "AWP_DATABASE_POOL_MODE",
    "what --database-url leads to: 'session' (PostgreSQL, or a pooler in session mode) or "
    "'transaction' (a pooler in transaction mode: no statement cache, no session "
    "settings; needs --session-database-url)",
    choices=tuple(PoolMode),
    read=PoolMode,
)
NO_MIGRATE: Final = flag(
    "--no-migrate",
    "AWP_NO_MIGRATE",
    "do not migrate the database at start (run `awp-server migrate` as its own step); "
    "refuse to start while a migration this build needs is missing",
    switch=True,
)


def check_urls(database_url: str, session_database_url: str, pool_mode: PoolMode) -> None:
    """ValueError when LISTEN and the migrations would end up on a transaction pooler."""
    if pool_mode is PoolMode.TRANSACTION and session_database_url in ("", database_url):
        raise ValueError(
            "--database-pool-mode transaction needs --session-database-url: LISTEN and "
            "migrations need a session (PostgreSQL itself, or a session-mode pool)"
        )
