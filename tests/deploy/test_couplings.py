"""What the manifests must agree on with the binaries, read from both: each container's
arguments and environment are parsed by its binary's own settings parser, with the
example secrets mounted where the pod would mount them, and compared with the ports,
probes, grace periods, budgets and policies around them."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from awp_common.flags import host_port
from awp_coordinator.config import parse as coordinator_parse
from awp_server import app
from awp_server.config import ServerConfig
from awp_server.config import parse as server_parse
from awp_worker._config import WorkerConfig, parse_config
from deploy.manifests import (
    DEPLOY,
    KEDA,
    SECRETS_EXAMPLE,
    Manifest,
    container,
    documents,
    find,
    labels,
    longest_worker_stop,
    of_kind,
    pod,
    port,
    secret_files,
    settings_environment,
    workloads,
)

NAMESPACE = "awp"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return secret_files(tmp_path_factory.mktemp("mounted"))


def _server(files: dict[str, Path]) -> ServerConfig:
    spec = container(find("Deployment", "awp-server"))
    return server_parse(spec["args"], settings_environment(spec, files))


def _worker(files: dict[str, Path]) -> WorkerConfig:
    spec = container(find("Deployment", "awp-worker"))
    return parse_config(spec["args"], settings_environment(spec, files))


def _prestop_seconds(spec: dict[str, Any]) -> float:
    command = spec.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def _annotated_port(workload: Manifest) -> int:
    return int(workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"])


# ---------------------------------------------------------------- awp-server


def test_server_ports_probes_and_service_match_its_flags(files: dict[str, Path]) -> None:
    deployment = find("Deployment", "awp-server")
    spec = container(deployment)
    config = _server(files)
    # Production settings: TLS, credentials, no --insecure, the URL from the secret.
    assert config.tls is not None and config.credentials_file and not config.insecure
    assert config.database_url == (documents(SECRETS_EXAMPLE)[0]["stringData"]["url"].strip()), (
        "the URL comes from the mounted secret file"
    )
    listen_host, listen_port = host_port(config.listen)
    assert config.health_listen and config.metrics_listen
    health_host, health_port = host_port(config.health_listen)
    metrics_host, metrics_port = host_port(config.metrics_listen)
    assert listen_host == health_host == metrics_host == "0.0.0.0"
    assert listen_port == port(spec, "grpc")
    assert health_port == port(spec, "health")
    assert metrics_port == port(spec, "metrics") == _annotated_port(deployment)
    # The kubelet's gRPC probes ask the plaintext health port: liveness (and startup)
    # the service that stays SERVING without PostgreSQL, readiness the overall status.
    for probe in ("startupProbe", "livenessProbe"):
        assert spec[probe]["grpc"] == {"port": health_port, "service": app.LIVENESS_SERVICE}
    assert spec["readinessProbe"]["grpc"] == {"port": health_port}
    service = find("Service", "awp-server")
    assert service["spec"]["selector"] == labels(deployment)
    (grpc_port,) = service["spec"]["ports"]
    assert grpc_port["targetPort"] == "grpc"


def test_server_grace_covers_the_endpoint_removal_and_its_shutdown_grace(
    files: dict[str, Path],
) -> None:
    deployment = find("Deployment", "awp-server")
    spec = container(deployment)
    config = _server(files)
    grace = pod(deployment)["terminationGracePeriodSeconds"]
    prestop = _prestop_seconds(spec)
    assert prestop > 0, "a preStop pause while the endpoint leaves the Service"
    # Then SIGTERM: in-flight calls get --shutdown-grace, then the pool closes.
    assert grace > prestop + config.shutdown_grace_s, (grace, prestop, config.shutdown_grace_s)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ---------------------------------------------------------------- awp-worker


def test_worker_reaches_the_service_and_its_grace_covers_drain_and_hand_back(
    files: dict[str, Path],
) -> None:
    deployment = find("Deployment", "awp-worker")
    spec = container(deployment)
    config = _worker(files)
    service = find("Service", "awp-server")
    (grpc_port,) = service["spec"]["ports"]
    assert config.server == f"{service['metadata']['name']}:{grpc_port['port']}"
    # TLS to the server, checked against the name the worker dials.
    assert config.tls and config.tls_server_name == service["metadata"]["name"]
    assert config.tls_ca_file in files and config.worker_token.strip() == "REPLACE-ME"
    assert config.metrics_listen is not None
    metrics_host, metrics_port = host_port(config.metrics_listen)
    assert metrics_host == "0.0.0.0"
    assert metrics_port == port(spec, "metrics") == _annotated_port(deployment)
    grace = pod(deployment)["terminationGracePeriodSeconds"]
    assert grace >= longest_worker_stop(config), (grace, longest_worker_stop(config))
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


# ---------------------------------------------------------------- awp-coordinator


def test_coordinators_are_a_leader_and_a_standby(files: dict[str, Path]) -> None:
    deployment = find("Deployment", "awp-coordinator")
    spec = container(deployment)
    config = coordinator_parse(spec["args"], settings_environment(spec, files))
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert config.metrics_listen is not None
    host, metrics_port = host_port(config.metrics_listen)
    assert host == "0.0.0.0"
    assert metrics_port == port(spec, "metrics") == _annotated_port(deployment)
    assert config.database_url.startswith("postgresql://")


def test_the_migration_job_runs_the_servers_migrate_step(files: dict[str, Path]) -> None:
    job = find("Job", "awp-migrate")
    spec = container(job)
    assert spec["command"] == ["awp-server"] and spec["args"][0] == "migrate"
    assert settings_environment(spec, files)["AWP_DATABASE_URL_FILE"]
    assert pod(job)["restartPolicy"] == "Never"
    for name in ("awp-server", "awp-coordinator"):
        env = settings_environment(container(find("Deployment", name)), files)
        assert env["AWP_NO_MIGRATE"] == "true", f"{name} leaves the schema to the Job"


# ---------------------------------------------------------------- every workload


def _matches(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_every_deployment_survives_one_pod_down() -> None:
    budgets = of_kind("PodDisruptionBudget")
    for deployment in of_kind("Deployment"):
        name = deployment["metadata"]["name"]
        (budget,) = [b for b in budgets if _matches(b["spec"]["selector"], labels(deployment))]
        replicas = deployment["spec"]["replicas"]
        if "minAvailable" in budget["spec"]:
            allowed = replicas - budget["spec"]["minAvailable"]
            kept = budget["spec"]["minAvailable"]
        else:
            allowed = budget["spec"]["maxUnavailable"]
            kept = replicas - allowed
        assert allowed >= 1, f"{name}: the budget blocks every eviction (a node drain)"
        assert kept >= 1, f"{name}: the budget lets every pod go at once"
        assert replicas >= 2, f"{name}: one pod down must leave one serving"
        term = pod(deployment)["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert _matches(term["labelSelector"], labels(deployment)), name


def _dockerfile_user() -> int:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    return int(user.split(":")[0])


def test_every_container_runs_non_root_confined_with_limits() -> None:
    uid = _dockerfile_user()
    assert uid != 0
    for workload in workloads():
        name = workload["metadata"]["name"]
        spec = pod(workload)
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] == uid, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        # Service links would inject AWP_SERVER_PORT & co., where AWP_* are settings.
        assert spec["enableServiceLinks"] is False, name
        one = container(workload)
        security = one["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["runAsNonRoot"] is True, name
        assert security["capabilities"] == {"drop": ["ALL"]}, name
        resources = one["resources"]
        for kind in ("cpu", "memory"):
            assert kind in resources["requests"] and kind in resources["limits"], (name, kind)
        # The root filesystem is read-only: /tmp (HOME in the image) is a volume.
        volumes = {v["name"]: v for v in spec["volumes"]}
        (tmp,) = [m for m in one["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in volumes[tmp["name"]], name


def test_every_mounted_secret_has_its_keys_in_the_example(files: dict[str, Path]) -> None:
    secrets = {doc["metadata"]["name"]: doc for doc in documents(SECRETS_EXAMPLE)}
    mounted = set()
    for workload in workloads():
        for volume in pod(workload)["volumes"]:
            if "secret" in volume:
                source = volume["secret"]
                keys = {item["key"] for item in source.get("items", [])}
                assert keys <= set(secrets[source["secretName"]]["stringData"])
                mounted.add(source["secretName"])
    assert mounted == set(secrets), "the example lists exactly the secrets mounted"
    # No secret in an environment variable's value or on a command line.
    for workload in workloads():
        for item in container(workload).get("env", []):
            assert "secretKeyRef" not in item.get("valueFrom", {}), item


def test_the_image_exposes_every_port_the_pods_use() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    (exposed,) = [set(map(int, line.split()[1:])) for line in lines if line.startswith("EXPOSE")]
    used = {p["containerPort"] for w in workloads() for p in container(w).get("ports", [])}
    assert used == exposed


# ---------------------------------------------------------------- network policies

Peer = tuple[str, dict[str, str]]  # (namespace, pod labels)
POSTGRES: Peer = (NAMESPACE, {"app.kubernetes.io/name": "postgresql"})


def _component(name: str) -> Peer:
    return (NAMESPACE, {"app.kubernetes.io/name": "awp", "app.kubernetes.io/component": name})


def _peer_matches(rule_peer: dict[str, Any], peer: Peer) -> bool:
    namespace, pod_labels = peer
    if "ipBlock" in rule_peer:
        return False  # pods are matched by selectors here; addresses by _egress_to_address
    namespaces = rule_peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = namespace == NAMESPACE
    else:
        in_namespace = _matches(namespaces, {"kubernetes.io/metadata.name": namespace})
    pods = rule_peer.get("podSelector", {})
    return in_namespace and _matches(pods, pod_labels)


def _ports_match(rule: dict[str, Any], number: int) -> bool:
    return "ports" not in rule or any(p["port"] == number for p in rule["ports"])


def _allows(direction: str, subject: Peer, other: Peer, number: int) -> bool:
    """Whether the policies selecting subject let it talk to other (egress) or be
    talked to by it (ingress) on port number; no selecting policy: not isolated."""
    policies = [
        p
        for p in of_kind("NetworkPolicy")
        if subject[0] == NAMESPACE
        and direction in p["spec"]["policyTypes"]
        and _matches(p["spec"]["podSelector"], subject[1])
    ]
    if not policies:
        return True
    key, peers = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    return any(
        _rule_admits(rule, peers, other, number)
        for policy in policies
        for rule in policy["spec"].get(key, [])
    )


def _rule_admits(rule: dict[str, Any], peers: str, other: Peer, number: int) -> bool:
    if not _ports_match(rule, number):
        return False
    # A rule without from/to admits every peer.
    return peers not in rule or any(_peer_matches(peer, other) for peer in rule[peers])


def reaches(source: Peer, destination: Peer, number: int) -> bool:
    return _allows("Egress", source, destination, number) and _allows(
        "Ingress", destination, source, number
    )


def _egress_to_address(source: Peer, octets: tuple[int, int, int, int]) -> bool:
    """Whether the source may open a connection to an address outside the cluster."""
    address = ipaddress.ip_address(".".join(map(str, octets)))
    policies = [
        p
        for p in of_kind("NetworkPolicy")
        if "Egress" in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], source[1])
    ]
    blocks = [
        peer["ipBlock"]
        for policy in policies
        for rule in policy["spec"]["egress"]
        for peer in rule.get("to", [])
        if "ipBlock" in peer
    ]
    return not policies or any(
        address in ipaddress.ip_network(block["cidr"])
        and not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
        for block in blocks
    )


def test_network_policies_let_workers_and_clients_reach_the_server_only() -> None:
    server, coordinator, worker = (_component(c) for c in ("server", "coordinator", "worker"))
    migrate = _component("migrate")
    client_here, client_elsewhere = (NAMESPACE, {"app": "client"}), ("apps", {"app": "client"})
    monitoring = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
    for source in (worker, client_here, client_elsewhere):
        assert reaches(source, server, 50051), source
    # Only the server, the coordinators and the migration reach PostgreSQL.
    for source in (server, coordinator, migrate):
        assert reaches(source, POSTGRES, 5432), source
    for source in (worker, client_here, client_elsewhere, monitoring):
        assert not reaches(source, POSTGRES, 5432), source
    (database,) = {
        tuple(int(x) for x in e.split("/")[0].split("."))
        for p in of_kind("NetworkPolicy")
        for rule in p["spec"].get("egress", [])
        for peer in rule.get("to", [])
        if "ipBlock" in peer
        for e in peer["ipBlock"]["except"]
    }
    assert not _egress_to_address(worker, database), "a worker reaches the database's address"
    assert _egress_to_address(worker, (198, 51, 100, 7)), "a worker's actions reach the world"
    # Metrics: Prometheus only.
    for target, number in ((server, 9464), (coordinator, 9465), (worker, 9466)):
        assert reaches(monitoring, target, number), target
        assert not reaches(client_elsewhere, target, number), target
    assert not reaches(worker, coordinator, 9465)


# ---------------------------------------------------------------- autoscaling


def test_the_optional_autoscaler_scales_the_workers_by_their_slots(
    files: dict[str, Path],
) -> None:
    (scaled,) = documents(KEDA)
    spec = scaled["spec"]
    worker = find("Deployment", "awp-worker")
    assert spec["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert scaled["metadata"]["namespace"] == NAMESPACE
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert int(trigger["metadata"]["threshold"]) == _worker(files).concurrency
    # Never below what the disruption budget needs to let one pod go.
    assert 2 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
