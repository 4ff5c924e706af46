"""The claim loop: ask for as many leases as there are free slots, while ACTIVE.

Each Claim is a long poll (the server parks it until work appears or ``claim_wait``
ends). After an empty answer or an error the loop backs off, exponentially with
jitter, from ``claim_backoff_initial`` to ``claim_backoff_max``; a lease received
resets the backoff, and a slot that frees wakes the loop at once. The server saying
the session drains (WORKER_DRAINING) ends the loop and starts this side's drain.

While results wait to be reported (``reporting``), no Claim is sent: their Complete
claims the free slots itself (awp_worker._completer), and the loop looks again once it
is answered (its results' slots freed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from awp_protocol.errors import Reason
from awp_worker._attempt import Attempts
from awp_worker._backoff import Backoff
from awp_worker._errors import Kind, classify, describe, error_reason, session_lost
from awp_worker._lifecycle import State
from awp_worker._owner import Owner

log = logging.getLogger("awp_worker.claims")


class ClaimLoop:
    def __init__(
        self, owner: Owner, attempts: Attempts, reporting: Callable[[], bool] = lambda: False
    ) -> None:
        self._owner = owner
        self._attempts = attempts
        self._reporting = reporting

    def _active(self) -> bool:
        return self._owner.lifecycle.state is State.ACTIVE

    async def run(self) -> None:
        owner = self._owner
        config, lifecycle, metrics = owner.config, owner.lifecycle, owner.metrics
        backoff = Backoff(config.claim_backoff_initial, config.claim_backoff_max)
        loop = asyncio.get_running_loop()
        while self._active():
            seen = owner.leases.releases
            free = config.concurrency - len(owner.leases)
            if free <= 0 or self._reporting():
                await self._pause(seen)
                continue
            started = loop.time()
            try:
                response = await owner.session.claim(free)
            except grpc.RpcError as exc:
                if error_reason(exc) == Reason.WORKER_DRAINING:
                    metrics.claims.labels("draining").inc()
                    if self._active():
                        log.info("the server says this session is draining: no more claims")
                        owner.request_shutdown()
                    return
                if classify(exc) is Kind.PERMANENT:
                    if not self._active():
                        # Our own Drain may have stopped the session before this
                        # Claim arrived: nothing is lost, claiming is over anyway.
                        log.debug("Claim after the drain: %s", describe(exc))
                        return
                    raise session_lost(exc) from None
                metrics.claims.labels("error").inc()
                level = logging.WARNING if backoff.failures % 10 == 0 else logging.DEBUG
                log.log(level, "Claim failed (%s); backing off", describe(exc))
                await lifecycle.wait_until(lambda: not self._active(), within=backoff.next())
                continue
            if response.leases:
                metrics.claims.labels("leases").inc()
                backoff.reset()
                self._attempts.start(response.leases)
                continue
            metrics.claims.labels("empty").inc()
            metrics.empty_claims.inc()
            if loop.time() - started >= 0.9 * config.claim_wait > 0:
                # The server held the long poll to its end: that already throttles, so
                # the backoff does not grow (new work must not wait up to its cap).
                backoff.reset()
            await self._pause(seen, within=backoff.next())

    async def _pause(self, seen: int, within: float | None = None) -> None:
        """Wait ``within`` seconds, cut short by a slot freed since the loop saw
        ``seen`` releases, or by the session leaving ACTIVE."""
        leases = self._owner.leases
        await self._owner.lifecycle.wait_until(
            lambda: leases.releases != seen or not self._active(), within
        )
