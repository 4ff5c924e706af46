"""Rate limits and token budgets from application code (docs/workflows.md).

    async with AsyncClient() as client:
        limits = RateLimits(client)
        await limits.set("openai-tpm", 90_000, per=timedelta(minutes=1))
        print((await limits.get("openai-tpm")).used)
        print((await limits.overview()).keys_waiting)  # keys holding tasks back now

A task declares what it uses (``awp_sdk.Rate``); the action reports what it really used
and a provider's "slow down" (``ActionContext.report_usage``, ``ActionContext.slow_down``).
"""

from __future__ import annotations

from datetime import timedelta

from google.protobuf import duration_pb2

from awp.v1 import limits_pb2
from awp_sdk import decode
from awp_sdk.client import AsyncClient
from awp_sdk.records import LimitsOverview, RateLimit


class RateLimits:
    """The rate-limit calls of one AsyncClient."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def set(self, name: str, units: int, *, per: timedelta) -> RateLimit:
        """Creates or changes the limit: at most ``units`` in any window of ``per``."""
        period = duration_pb2.Duration()
        period.FromTimedelta(per)
        answer = await self._client.call(
            self._client.control.SetRateLimit,
            limits_pb2.SetRateLimitRequest(
                spec=limits_pb2.RateLimitSpec(name=name, units=units, period=period)
            ),
        )
        return decode.rate_limit(answer.limit)

    async def get(self, name: str) -> RateLimit:
        answer = await self._client.call(
            self._client.control.GetRateLimit, limits_pb2.GetRateLimitRequest(name=name)
        )
        return decode.rate_limit(answer.limit)

    async def list(self) -> list[RateLimit]:
        return list((await self.overview()).limits)

    async def overview(self) -> LimitsOverview:
        """Every limit, and how many ready tasks each rate limit and concurrency key holds
        back now."""
        answer = await self._client.call(
            self._client.control.ListRateLimits, limits_pb2.ListRateLimitsRequest()
        )
        return decode.limits_overview(answer)
