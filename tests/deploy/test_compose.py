"""deploy/compose.yaml, the local topology for a container engine, is the same topology
as `make cluster` (processes) and the Kubernetes manifests: as many servers,
coordinators and workers; every awp command in it is one its binary accepts; workers
find both servers under one name; only the servers, coordinators and migration reach
PostgreSQL; every container is non-root and confined."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from awp_common.flags import host_port
from awp_coordinator.config import parse as coordinator_parse
from awp_server.config import parse as server_parse
from awp_worker._config import parse_config
from deploy.manifests import DEPLOY, REPOSITORY, find, longest_worker_stop

COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def _binary(service: dict[str, Any]) -> str:
    return str(service["command"][0])


def _role(binary: str) -> dict[str, dict[str, Any]]:
    return {
        name: s
        for name, s in SERVICES.items()
        if s.get("command", [""])[0] == binary and "migrate" not in s["command"]
    }


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)s", text)
    assert match, text
    return float(match[1])


def _make_cluster() -> dict[str, int]:
    makefile = (REPOSITORY / "Makefile").read_text()
    (line,) = re.findall(r"^\t\$\(BIN\)/awp dev (.+)$", makefile, re.MULTILINE)
    return {flag: int(n) for flag, n in re.findall(r"--(\w+) (\d+)", line)}


def test_one_topology_in_compose_make_cluster_and_kubernetes() -> None:
    servers, coordinators = _role("awp-server"), _role("awp-coordinator")
    (workers,) = _role("awp-worker").values()
    counts = {
        "servers": len(servers),
        "coordinators": len(coordinators),
        "workers": workers["deploy"]["replicas"],
    }
    assert counts == _make_cluster()
    for role, name in (("servers", "server"), ("coordinators", "coordinator")):
        assert counts[role] == find("Deployment", f"awp-{name}")["spec"]["replicas"]
    assert counts["workers"] == find("Deployment", "awp-worker")["spec"]["replicas"]


@pytest.mark.parametrize(
    ("binary", "parse"),
    [("awp-server", server_parse), ("awp-coordinator", coordinator_parse), ("awp-worker", None)],
)
def test_every_awp_command_is_accepted_by_its_binary(binary: str, parse: Any) -> None:
    for name, service in _role(binary).items():
        env = {k: str(v) for k, v in service.get("environment", {}).items()}
        args = service["command"][1:]
        config = parse_config(args, env) if parse is None else parse(args, env)
        assert config is not None, name


def test_workers_find_both_servers_under_one_name_and_drain_in_time() -> None:
    (worker,) = _role("awp-worker").values()
    config = parse_config(worker["command"][1:], {})
    host, port = host_port(config.server)
    for name, service in _role("awp-server").items():
        assert host in service["networks"]["default"]["aliases"], name
        server = server_parse(service["command"][1:], {"AWP_DATABASE_URL": "postgresql://x"})
        assert host_port(server.listen)[1] == port, name
        grace = _seconds(service["stop_grace_period"])
        assert grace > server.shutdown_grace_s, name
    assert _seconds(worker["stop_grace_period"]) >= longest_worker_stop(config)


def _networks(service: dict[str, Any]) -> set[str]:
    networks = service.get("networks", ["default"])
    return set(networks) if isinstance(networks, list | dict) else set()


def test_only_servers_coordinators_and_the_migration_reach_postgres() -> None:
    database = _networks(SERVICES["postgres"])
    assert database == {"database"}
    reaching = {name for name, s in SERVICES.items() if _networks(s) & database}
    allowed = {"postgres", "migrate", *_role("awp-server"), *_role("awp-coordinator")}
    assert reaching == allowed
    (worker,) = _role("awp-worker").values()
    assert not any("DATABASE" in key for key in worker.get("environment", {}))


def test_every_awp_container_is_non_root_and_confined() -> None:
    for name, service in SERVICES.items():
        if name == "postgres":
            continue
        assert service["user"] == "10001:10001", name
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"], name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        for published in service.get("ports", []):
            assert published.startswith("127.0.0.1:"), (name, published)
