"""A TCP load balancer on 127.0.0.1 in front of several awp-server processes, as a
Kubernetes Service spreads connections over its ready pods: each new connection goes to
the next backend in turn, skipping any that refuses it (stopped, not yet listening).
A connection stays with its backend until either end closes it; the backends list
changes as a rolling deploy adds new servers and retires old ones.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from proxy import TcpProxy


class LoadBalancer(TcpProxy):
    def __init__(self, ports: Iterable[int] = ()) -> None:
        super().__init__("127.0.0.1", 0)  # the proxy's single target is never used
        self.backends: list[int] = list(ports)
        self.routed: Counter[int] = Counter()  # connections per backend port
        self.refused = 0
        self._turn = 0

    def add(self, port: int) -> None:
        self.backends.append(port)

    def remove(self, port: int) -> None:
        self.backends.remove(port)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        for _ in range(len(self.backends)):
            port = self.backends[self._turn % len(self.backends)]
            self._turn += 1
            try:
                connection = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                self.refused += 1
                continue
            self.routed[port] += 1
            return connection
        raise OSError("no backend accepted the connection")
