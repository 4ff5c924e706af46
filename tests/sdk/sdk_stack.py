"""The SDK tests' handle on their stack (the fixtures are in conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass

from awp_sdk import AsyncClient
from kit import ADMIN_TOKEN, ServerFactory, ServerHandle


@dataclass
class Stack:
    server: ServerHandle
    start_server: ServerFactory

    @property
    def address(self) -> str:
        return self.server.address

    def client(self) -> AsyncClient:
        return AsyncClient(self.address, token=ADMIN_TOKEN)

    async def restart_server(self) -> None:
        """Stops the server, then starts another on the same address."""
        await self.server.running.stop(0)
        self.server = await self.start_server(listen=self.address)
