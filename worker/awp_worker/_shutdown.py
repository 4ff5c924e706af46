"""How a session ends, once it has left ACTIVE: drain, hand back, or stop at once.

- Drain (a shutdown request, or the server drains the session): a first Drain tells
  the server (no new claims; heartbeats and Completes go on); held leases finish
  within the shutdown grace; a final Drain, with any leases given up locally,
  stops the session. Exit 0.
- Hand back (a second request or the shutdown grace during the drain, or a part's
  unexpected failure): cancel what still runs, give computed results a moment to be
  reported, and hand every held lease back in the final Drain, so that it is retried
  at once instead of after its lease expires. Exit 0 (1 after a failure).
- Session lost (a permanent session error): cancel everything, send nothing. Exit 3.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from awp.v1 import types_pb2, worker_pb2
from awp_worker._attempt import revoke
from awp_worker._errors import SessionLost
from awp_worker._lease import STOOD_DOWN, Phase, StandDown
from awp_worker._lifecycle import EXIT_FAILURE, EXIT_OK, EXIT_SESSION_LOST, State
from awp_worker._owner import Owner
from awp_worker._supervisor import Supervisor

log = logging.getLogger("awp_worker.shutdown")


class Shutdown:
    def __init__(
        self,
        owner: Owner,
        supervisor: Supervisor,
        claims: asyncio.Task[None],
        side_tasks: Sequence[asyncio.Task[None]],
    ) -> None:
        self._owner = owner
        self._sup = supervisor
        self._claims = claims
        self._side_tasks = side_tasks

    async def run(self) -> int:
        """End the session the way its state calls for; returns the exit code."""
        if self._sup.failure is not None:
            return await self._abort()
        return await self._drain()

    async def _drain(self) -> int:
        owner = self._owner
        lifecycle, leases = owner.lifecycle, owner.leases
        loop = asyncio.get_running_loop()
        deadline = loop.time() + owner.config.shutdown_grace
        log.info(
            "draining: no new claims; waiting up to %gs for %d held leases",
            owner.config.shutdown_grace,
            len(leases),
        )
        # The first Drain (retried while the server is unreachable) gives way to a
        # second shutdown request or a failure; the final Drain follows either way.
        try:
            first = await lifecycle.while_in(
                State.DRAINING,
                owner.session.drain([], give_up_after=max(1.0, deadline - loop.time())),
                name="drain",
            )
        except SessionLost as exc:
            lifecycle.move(State.STOPPED)
            return await self._session_lost(exc)
        if first is not None and first.session_state == types_pb2.WORKER_STATE_STOPPED:
            lifecycle.mark_server_stopped()
            # The server stops a session only once it holds none of its leases: any
            # still running here were revoked (say, their run canceled) before a
            # heartbeat could tell, and no result of theirs can be accepted now.
            for held in leases:
                revoke(owner, held, "revoked")
        if lifecycle.server_stopped:
            await self._sup.cancel([self._claims], within=5.0)

        def idle() -> bool:
            return self._claims.done() and not leases

        await lifecycle.wait_until(
            lambda: idle() or lifecycle.state is not State.DRAINING, within=deadline - loop.time()
        )
        if self._sup.failure is not None:
            return await self._abort()
        if not idle():
            why = (
                "second shutdown request"
                if lifecycle.state is State.HANDING_BACK
                else "shutdown grace"
            )
            lifecycle.move(State.HANDING_BACK)
            log.warning("%s: cancelling %d held leases and handing them back", why, len(leases))
            return await self._hand_back()
        await self._sup.cancel(self._side_tasks, within=5.0)
        hand_back = leases.abandoned_refs()
        if lifecycle.server_stopped and not hand_back:
            log.info("drained: session stopped")
            return EXIT_OK
        return await self._final_drain(hand_back)

    async def _hand_back(self) -> int:
        """Cancel every running lease, hand all held leases back, stop the session."""
        owner, sup = self._owner, self._sup
        await sup.cancel([self._claims], within=5.0)
        running = [held for held in owner.leases if held.phase is Phase.RUNNING]
        for held in running:
            held.cancel("shutdown")
        tasks = [held.task for held in running if held.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        # Results already computed get a short chance to be reported.
        await owner.lifecycle.wait_until(
            lambda: (
                sup.failure is not None
                or not any(held.phase is Phase.REPORTING for held in owner.leases)
            ),
            within=min(2.0, owner.config.rpc_timeout),
        )
        await sup.cancel(self._side_tasks, within=5.0)
        hand_back = owner.leases.refs() + owner.leases.abandoned_refs()
        return await self._final_drain(hand_back)

    async def _final_drain(self, hand_back: Sequence[worker_pb2.LeaseRef]) -> int:
        config = self._owner.config
        try:
            response = await self._owner.session.drain(
                hand_back, give_up_after=max(5.0, config.rpc_timeout)
            )
        except SessionLost as exc:
            log.error("final Drain refused (%s); the server settles the leases itself", exc)
            return EXIT_FAILURE
        if response is None:
            return EXIT_FAILURE
        if response.session_state == types_pb2.WORKER_STATE_STOPPED:
            log.info("drained: session stopped (%d leases handed back)", len(hand_back))
        else:
            log.warning(
                "final Drain left the session %s with %d leases; they expire on their own",
                types_pb2.WorkerState.Name(response.session_state),
                response.active_leases,
            )
        return EXIT_OK

    async def _abort(self) -> int:
        failure = self._sup.failure
        if isinstance(failure, SessionLost):
            return await self._session_lost(failure)
        log.error(
            "worker task %s failed unexpectedly; stopping", self._sup.failed_task, exc_info=failure
        )
        await self._hand_back()
        return EXIT_FAILURE

    async def _session_lost(self, error: SessionLost) -> int:
        log.error(
            "session ended permanently (%s): all work stopped, exiting so that a new "
            "worker registers",
            error,
            extra={STOOD_DOWN: StandDown.SESSION_LOST},
        )
        for held in self._owner.leases:
            held.cancel("session lost")
        await self._sup.close(within=5.0)
        return EXIT_SESSION_LOST
