"""The worker runtime: one session, from Register to the last Drain (DESIGN.md §4, §8).

The parts, each in its own module, share one owner (this runtime, ``_owner.Owner``):

- ``_session``: the channel and the calls, with their retries;
- ``_heartbeat``: the one heartbeat stream (renewals, revocations, session state);
- ``_claims``: the claim loop, while ACTIVE;
- ``_attempt``: one executor task per held lease, and its report;
- ``_completer``: results coalesced into Complete calls;
- ``_shutdown``: drain, hand back or stop, once the session leaves ACTIVE;
- ``_lifecycle``: the one state all of them follow, and the one way to wait.

The heartbeat stream, the claim loop, the flusher and the executor tasks run under one
supervisor: the first unexpected failure ends ACTIVE and stops the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from awp_common.flags import host_port
from awp_sdk.actions import ActionRegistry
from awp_worker._attempt import Attempts
from awp_worker._claims import ClaimLoop
from awp_worker._completer import REJECTED, ResultFlusher
from awp_worker._config import WorkerConfig
from awp_worker._errors import SessionLost
from awp_worker._executors import Executor, MockExecutor, PythonExecutor
from awp_worker._heartbeat import HeartbeatStream
from awp_worker._lease import HeldLease, LeaseTable
from awp_worker._lifecycle import EXIT_OK, EXIT_SESSION_LOST, EXIT_USAGE, Lifecycle, State
from awp_worker._logging import bind, unbind
from awp_worker._metrics import Metrics
from awp_worker._session import Session, TlsMismatch
from awp_worker._shutdown import Shutdown
from awp_worker._supervisor import Supervisor

log = logging.getLogger("awp_worker.runtime")


def default_executors(
    config: WorkerConfig, registry: ActionRegistry | None = None
) -> dict[str, Executor]:
    """The built-in executors for the configured kinds (``mock``, ``python``)."""
    executors: dict[str, Executor] = {}
    for kind in config.kinds:
        if kind == "mock":
            executors[kind] = MockExecutor()
        elif kind == "python":
            # Headroom: a cancelled sync action keeps its thread until it returns.
            executors[kind] = PythonExecutor(registry, max_threads=config.concurrency + 4)
    return executors


class WorkerRuntime:
    """One worker process's session. ``await run()`` returns the process exit code.

    Construct it inside or outside a loop; ``run()`` creates the gRPC channel in the
    running loop. ``executors`` maps executor kinds to executors (default: the
    built-in ones for ``config.kinds``); every configured kind needs one.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        executors: Mapping[str, Executor] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.executors: dict[str, Executor] = (
            dict(executors) if executors is not None else default_executors(config)
        )
        missing = [kind for kind in config.kinds if kind not in self.executors]
        if missing:
            raise ValueError(f"no executor for kind(s) {', '.join(missing)}")
        self.metrics = metrics if metrics is not None else Metrics()
        self.exit_code: int | None = None
        self.lifecycle = Lifecycle()
        self.session = Session(config, self.metrics)
        self.leases = LeaseTable(self._released)
        self._sup = Supervisor(self._failed)

    # --- public surface -----------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call: drain gracefully. Second call: cancel running leases, hand them
        back, stop. Call it from the loop's thread (e.g. ``loop.add_signal_handler``)."""
        state = self.lifecycle.state
        if state in (State.STARTING, State.ACTIVE):
            log.info(
                "shutdown requested: draining (up to %gs); request again to stop at once",
                self.config.shutdown_grace,
            )
            self.lifecycle.move(State.DRAINING)
        elif state is State.DRAINING:
            log.info("second shutdown request received")
            self.lifecycle.move(State.HANDING_BACK)

    @property
    def held_leases(self) -> int:
        return len(self.leases)

    @property
    def worker_id(self) -> str | None:
        return self.session.worker_id

    async def wait_registered(self) -> str:
        """Wait until Register succeeded; returns the worker id (for tests)."""
        await self.lifecycle.wait_until(lambda: self.worker_id is not None)
        assert self.worker_id is not None
        return self.worker_id

    async def run(self) -> int:
        try:
            self.session.open()
        except OSError as exc:
            log.error("cannot read a TLS file: %s", exc)
            return self._exit(EXIT_USAGE)
        metrics_server = None
        try:
            if self.config.metrics_listen:
                host, port = host_port(self.config.metrics_listen)
                try:
                    metrics_server = self.metrics.serve(host, port)
                except OSError as exc:
                    log.error("cannot serve metrics on %s:%d: %s", host, port, exc)
                    return self._exit(EXIT_USAGE)
                log.info("metrics on http://%s:%d/metrics", host, port)
            return self._exit(await self._run())
        finally:
            self.lifecycle.move(State.STOPPED)
            await self.session.close()
            for executor in self.executors.values():
                close = getattr(executor, "close", None)
                if callable(close):
                    close()
            if metrics_server is not None:
                await asyncio.to_thread(metrics_server.shutdown)
                metrics_server.server_close()

    def _exit(self, code: int) -> int:
        self.exit_code = code
        return code

    # --- the session --------------------------------------------------------------------

    async def _run(self) -> int:
        lifecycle = self.lifecycle
        try:
            registered = await lifecycle.while_in(
                State.STARTING, self.session.register(), name="register"
            )
        except SessionLost as exc:
            log.error("registration refused permanently (%s); exiting", exc)
            return EXIT_SESSION_LOST
        except TlsMismatch as exc:
            log.error("%s", exc)
            return EXIT_USAGE
        if registered is None:
            log.info("shutdown requested before registration finished; exiting")
            return EXIT_OK
        # No move if a shutdown was requested while the answer was on its way: the
        # session then drains at once.
        lifecycle.move(State.ACTIVE)
        token = bind(worker_id=self.worker_id)
        try:
            session = self.session
            log.info(
                "registered as %s (kinds %s, concurrency %d, heartbeat every %gs, lease TTL %gs)",
                self.config.name,
                ",".join(self.config.kinds),
                self.config.concurrency,
                session.heartbeat_interval,
                session.lease_ttl,
            )
            try:
                shutdown = self._start()
                await lifecycle.wait_until(lambda: lifecycle.state is not State.ACTIVE)
                return await shutdown.run()
            finally:
                await self._sup.close(within=5.0)
        finally:
            unbind(token)

    def _start(self) -> Shutdown:
        """Start the parts under the supervisor; what ends them once ACTIVE is over."""
        flusher = ResultFlusher(
            self,
            flush_size=self.config.flush_size,
            flush_interval=self.config.flush_interval,
        )
        attempts = Attempts(self, self.executors, flusher, self._sup)
        if not self.config.claim_separately:
            flusher.refill = attempts.start
        spawn = self._sup.spawn
        heartbeat = spawn(HeartbeatStream(self).run(), "heartbeat")
        flushing = spawn(flusher.run(), "flusher")
        claims = spawn(
            ClaimLoop(self, attempts, reporting=lambda: flusher.backlog > 0).run(), "claim"
        )
        claims.add_done_callback(lambda _: self.lifecycle.notify())
        return Shutdown(self, self._sup, claims, [heartbeat, flushing, claims])

    # --- what the parts report ----------------------------------------------------------

    def settled(self, held: HeldLease, outcome: str) -> None:
        if outcome == REJECTED:
            # The server refused the result itself: give the lease up so that the
            # final Drain hands it back and it is retried.
            self.leases.abandon(held)
        else:
            self.leases.release(held)

    def _released(self) -> None:
        self.metrics.leases_held.set(len(self.leases))
        self.lifecycle.notify()

    def _failed(self, error: BaseException) -> None:
        # A failure ends ACTIVE or DRAINING; once handing back or stopped, the shutdown
        # under way goes on (it sees the failure on the supervisor).
        if self.lifecycle.state in (State.ACTIVE, State.DRAINING):
            self.lifecycle.move(
                State.STOPPED if isinstance(error, SessionLost) else State.HANDING_BACK
            )
        self.lifecycle.notify()
