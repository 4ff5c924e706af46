"""What AWP processes say to each other through PostgreSQL: NOTIFY channels and
advisory-lock keys. Every sender, listener and lock holder names them from here, so
one side cannot be renamed without the other.
"""

from __future__ import annotations

from typing import Final

# --- NOTIFY channels (every wake-up is a latency optimisation: receivers also poll) ---

# Wakes the coordinator: a run started or was canceled, results were accepted, a
# worker registered, drained or lost its stream. The payload says why (for logs only).
COORDINATOR_CHANNEL: Final = "awp_coordinator"
# The coordinator's wake-ups that may have made a task ready: a parked Claim wakes on
# these too, to grant it itself (awp_db.claims), and not on the others (a worker
# registered or drained, a stream lost, a cancel), which would wake every parked Claim
# of a large idle fleet for nothing.
RUN_STARTED: Final = "run_started"
RESULTS_ACCEPTED: Final = "completed"
WAIT_RESUMED: Final = "resumed"
MAY_READY: Final = frozenset({RUN_STARTED, RESULTS_ACCEPTED, WAIT_RESUMED})
# Servers parking long-poll claims hear of new dispatches; the payload is the kind.
DISPATCH_CHANNEL: Final = "awp_dispatch"
# Every client that watches runs listens here; the payload is the run id.
RUN_EVENTS_CHANNEL: Final = "awp_run_events"
# Readers of output streams: new chunks were stored; the payload is the task's id.
STREAM_CHANNEL: Final = "awp_streams"
# A lease ended by anyone but its holder's result (the trigger of migration 0012 sends
# it); the payload is '<worker uuid>:<dispatch id>' (awp_db.revocations reads it).
LEASE_REVOKED_CHANNEL: Final = "awp_lease_revoked"

# --- advisory-lock keys: arbitrary constants shared by every AWP process ---------------

# Session lock held while migrating, so processes starting together migrate once.
MIGRATION_LOCK_KEY: Final = 0x415750_0001
# Transaction lock serialising dispatch creation (dispatching.create_dispatches).
DISPATCH_LOCK_KEY: Final = 4281170
