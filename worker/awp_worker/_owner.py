"""The one interface through which the parts of a session reach the session itself.

The heartbeat stream, the claim loop, the attempts and the result flusher each get
the owner (``WorkerRuntime`` in the process; a recorder in the flusher's tests) and
find there what they share: the lifecycle, the held leases, the connection, the
settings and metrics, and the two decisions that belong to the session as a whole.
"""

from __future__ import annotations

from typing import Protocol

from awp_worker._config import WorkerConfig
from awp_worker._lease import HeldLease, LeaseTable
from awp_worker._lifecycle import Lifecycle
from awp_worker._metrics import Metrics
from awp_worker._session import Session


class Owner(Protocol):
    @property
    def config(self) -> WorkerConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def lifecycle(self) -> Lifecycle: ...

    @property
    def leases(self) -> LeaseTable: ...

    @property
    def session(self) -> Session: ...

    def request_shutdown(self) -> None:
        """Drain (first call) or hand back at once (second call)."""

    def settled(self, held: HeldLease, outcome: str) -> None:
        """The flusher is done with ``held``'s result; ``outcome`` names how it ended
        (``_completer``'s outcome names)."""
