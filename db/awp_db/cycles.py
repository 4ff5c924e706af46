"""A worker's cycle in one transaction: a Complete that carries the next Claim
(DESIGN.md §4, docs/design.md §17 "A Complete that carries the next Claim").

The results are settled exactly as by leases.complete_many (leases.settle_calls), then
the slots they freed are leased exactly as by claims.claim_many (claims.lease_in), in
the same transaction: a task the settlement made ready is granted and leased to the
completing worker at once (the chain's hop in one transaction).

Lock order (awp_db.locks): the calls' session rows first (FOR NO KEY UPDATE, as a
Claim's), then the settlement's runs (one statement), dispatches, tasks and rate limit
rows; the claim then takes further runs and pending dispatches only SKIP LOCKED and
only tries the dispatch lock (dispatching.grant_for_claims). It never waits for the
dispatch lock at all: serialise_for_claims may wait only as a transaction's first
statement, and here the dispatch lock would come after the sessions it follows in the
order. (Were it taken first, every Complete would queue behind the coordinator's pass.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from awp_db import claims, leases, workers
from awp_db.connect import Conn
from awp_db.events import EventBatch
from awp_kernel import errors
from awp_kernel.fencing import ResultVerdict

log = logging.getLogger("awp.db.cycles")


@dataclass(frozen=True, slots=True)
class CycleCall:
    """One Complete call and the leases its worker wishes for next (0: none)."""

    completion: leases.Completion
    claim_max_leases: int = 0


@dataclass(frozen=True, slots=True)
class CycleAnswer:
    verdicts: list[ResultVerdict]
    issued: list[claims.IssuedLease]


async def complete_and_claim_many(
    conn: Conn,
    calls: Sequence[CycleCall],
    lease_ttl_ms: int,
    *,
    still_wanted: Callable[[int], bool],
    grant: bool = True,
) -> list[CycleAnswer | errors.AwpError]:
    """Several Complete calls, each with its Claim, in one transaction, one answer per
    call in order. The results are judged and settled as leases.complete_many does; a
    call's session error is returned and changes nothing.

    still_wanted(i), asked just before commit, tells whether call i's caller still
    waits. If one that was issued leases does not, the transaction is rolled back and
    run again with that call's claim dropped (its results are still settled, as every
    Complete's are): no lease is ever committed for nobody.
    """
    dropped: set[int] = set()
    while True:
        try:
            return await _cycle_once(conn, calls, lease_ttl_ms, still_wanted, dropped, grant)
        except claims.ClaimAbandoned:
            departed = {i for i in range(len(calls)) if not still_wanted(i)}
            log.debug("Complete batch rolled back for %d departed callers", len(departed))
            dropped |= departed


async def _cycle_once(
    conn: Conn,
    calls: Sequence[CycleCall],
    lease_ttl_ms: int,
    still_wanted: Callable[[int], bool],
    dropped: set[int],
    grant: bool,
) -> list[CycleAnswer | errors.AwpError]:
    events = EventBatch()
    completions = [call.completion for call in calls]
    # Hashed before any lock is taken: the locks are held only for the judgement.
    digests = leases.digests_of(completions)
    wishes = [
        claims.ClaimCall(
            call.completion.worker_id,
            call.completion.session_token,
            0 if index in dropped else call.claim_max_leases,
        )
        for index, call in enumerate(calls)
    ]
    async with conn.transaction():
        sessions = await workers.authenticate_many(
            conn, [(c.worker_id, c.session_token) for c in completions], for_update=True
        )
        verdicts = await leases.settle_calls(conn, completions, sessions, digests, events)
        # A slow-down report pauses its limit for every grant once this commits: no claim
        # is served after it, so the pause is not held back (unseen by the other
        # servers' grants) for the length of one. The worker then claims on its own.
        pauses = any(result.slow_down for c in completions for result in c.results)
        issued = (
            {}
            if pauses
            else await claims.lease_in(
                conn, wishes, sessions, lease_ttl_ms, events, grant=grant, runs_held=True
            )
        )
        if any(given and not still_wanted(index) for index, given in issued.items()):
            raise claims.ClaimAbandoned()
        await events.flush(conn)
    return [
        outcome
        if isinstance(outcome, errors.AwpError)
        else CycleAnswer(outcome, issued.get(index, []))
        for index, outcome in enumerate(verdicts)
    ]
