"""Which ports a dev stack listens on: every one chosen before anything starts, all
distinct (ports left to the children, 0, would let the kernel hand one of them to two),
and a clear error for one already taken."""

from __future__ import annotations

from dataclasses import dataclass

from awp_cli.errors import usage
from awp_common.flags import host_port, is_loopback
from awp_common.processes import free_ports, port_free


@dataclass(frozen=True)
class Ports:
    # Where each server listens, "host:port".
    listens: list[str]
    # Each process's metrics port, by name.
    metrics: dict[str, int]
    postgres: int


def plan(listen: str, servers: int, metered: list[str], metrics_base: int) -> Ports:
    """The servers listen from `listen` on (its port 0: free ones); each of `metered`
    (servers first) gets metrics_base + its index (0: a free port)."""
    host, port = loopback(listen)
    spare = iter(free_ports(len(metered) + servers + 1))
    metrics = {
        name: (metrics_base + i if metrics_base else next(spare)) for i, name in enumerate(metered)
    }
    ports = [port + i if port else next(spare) for i in range(servers)]
    wanted = [(host, p, "--listen") for p in ports] if port else []
    wanted += [("127.0.0.1", p, f"metrics of {name}") for name, p in metrics.items()]
    for where, number, what in wanted:
        if not port_free(where, number):
            hint = "--listen" if what == "--listen" else "--metrics-port"
            raise usage(
                f"{where}:{number} ({what}) is already in use (another awp dev?); "
                f"stop it or choose another port with {hint}"
            )
    return Ports([f"{host}:{p}" for p in ports], metrics, next(spare))


def loopback(listen: str) -> tuple[str, int]:
    try:
        host, port = host_port(listen)
    except ValueError as exc:
        raise usage(f"--listen: {exc}") from None
    if not is_loopback(listen):
        raise usage(
            f"--listen {listen}: awp dev runs without tokens, so it listens on loopback only"
        )
    return host, port
