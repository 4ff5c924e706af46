"""ControlService's rate-limit RPCs (protos/awp/v1/limits.proto, docs/workflows.md "Rate
limits and token budgets"): the wire conversions and the audit trail; awp_db.ratelimits
stores them and awp_db.grant applies them."""

from __future__ import annotations

from awp.v1 import limits_pb2
from awp_db import ratelimits, reads, stats
from awp_kernel.errors import invalid
from awp_protocol.limits import MAX_RATE_PERIOD_MS, MAX_RATE_UNITS
from awp_server import control_requests as requests
from awp_server import convert
from awp_server.auth import caller
from awp_server.control_service import Context
from awp_server.errors import unary
from awp_server.wait_rpcs import ControlServiceWithWaits


def limit_to_proto(row: ratelimits.RateLimitRow) -> limits_pb2.RateLimit:
    message = limits_pb2.RateLimit(
        spec=limits_pb2.RateLimitSpec(
            name=row.name, units=row.units, period=convert.duration_from_ms(row.period_ms)
        ),
        used=row.used,
        updated_at=convert.timestamp(row.updated_at),
        updated_by=row.updated_by,
    )
    paused = convert.timestamp(row.paused_until) if row.paused else None
    if paused is not None:
        message.paused_until.CopyFrom(paused)
    return message


class ControlServiceWithLimits(ControlServiceWithWaits):
    """ControlService, schedule and rate-limit RPCs included."""

    @unary
    async def SetRateLimit(
        self, request: limits_pb2.SetRateLimitRequest, context: Context
    ) -> limits_pb2.SetRateLimitResponse:
        spec = request.spec
        requests.check_name("spec.name", spec.name)
        if not 0 <= spec.units <= MAX_RATE_UNITS:
            raise invalid("spec.units", f"must be 0 to {MAX_RATE_UNITS}")
        period_ms = spec.period.ToMilliseconds() if spec.HasField("period") else 0
        if not 1 <= period_ms <= MAX_RATE_PERIOD_MS:
            raise invalid("spec.period", "must be 1 ms to 24 h")
        async with self._pool.acquire() as conn:
            row = await ratelimits.set_limit(conn, spec.name, spec.units, period_ms, caller())
        requests.audit("SetRateLimit", limit=spec.name, units=spec.units, period_ms=period_ms)
        return limits_pb2.SetRateLimitResponse(limit=limit_to_proto(row))

    @unary
    async def GetRateLimit(
        self, request: limits_pb2.GetRateLimitRequest, context: Context
    ) -> limits_pb2.GetRateLimitResponse:
        requests.check_name("name", request.name)
        row = await ratelimits.get(self._pool, request.name)
        return limits_pb2.GetRateLimitResponse(limit=limit_to_proto(row))

    @unary
    async def ListRateLimits(
        self, request: limits_pb2.ListRateLimitsRequest, context: Context
    ) -> limits_pb2.ListRateLimitsResponse:
        # One snapshot: a limit's use and the tasks it holds back agree.
        async with reads.snapshot(self._pool) as conn:
            rows = await ratelimits.list_all(conn)
            waiting = await stats.limits_waiting(conn, rows)

        def of(kind: str) -> list[limits_pb2.LimitWaiting]:
            return [
                limits_pb2.LimitWaiting(name=w.name, waiting=w.waiting)
                for w in waiting
                if w.kind == kind
            ]

        return limits_pb2.ListRateLimitsResponse(
            limits=[limit_to_proto(row) for row in rows],
            rate_limits_waiting=of(stats.RATE),
            keys_waiting=of(stats.KEY),
        )
