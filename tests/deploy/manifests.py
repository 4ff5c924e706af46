"""The deployment files as data: the Kubernetes manifests by kind and name, a workload's
pod and container, and its settings as the binary would read them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from awp_worker._config import WorkerConfig

REPOSITORY = Path(__file__).resolve().parents[2]
DEPLOY = REPOSITORY / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SECRETS_EXAMPLE = KUBERNETES / "secrets.example.yaml"
KEDA = KUBERNETES / "optional" / "keda-scaledobject.yaml"
# Not Kubernetes API objects: kustomize's own files.
KUSTOMIZATIONS = (KUBERNETES / "kustomization.yaml", KUBERNETES / "migrate" / "kustomization.yaml")

Manifest = dict[str, Any]


def documents(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES.rglob("*.yaml") if p not in KUSTOMIZATIONS)


def objects() -> Iterator[tuple[Path, Manifest]]:
    for path in manifest_files():
        for doc in documents(path):
            yield path, doc


def find(kind: str, name: str) -> Manifest:
    found = [doc for _, doc in objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def of_kind(kind: str) -> list[Manifest]:
    return [doc for _, doc in objects() if doc["kind"] == kind]


def workloads() -> list[Manifest]:
    """Everything that runs a pod: the Deployments and the migration Job."""
    return [*of_kind("Deployment"), *of_kind("Job")]


def pod(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest) -> dict[str, Any]:
    (only,) = pod(workload)["containers"]
    return dict(only)


def port(container_spec: dict[str, Any], name: str) -> int:
    (number,) = [p["containerPort"] for p in container_spec["ports"] if p["name"] == name]
    return int(number)


def labels(workload: Manifest) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def secret_files(root: Path) -> dict[str, Path]:
    """The example secrets written out under root, as the kubelet would mount them:
    container path (/etc/awp/<volume mount>/<key>) -> the local file."""
    secrets = {doc["metadata"]["name"]: doc for doc in documents(SECRETS_EXAMPLE)}
    mounted: dict[str, Path] = {}
    for workload in workloads():
        volumes = {v["name"]: v for v in pod(workload)["volumes"]}
        for mount in container(workload)["volumeMounts"]:
            source = volumes[mount["name"]].get("secret")
            if source is None:
                continue
            data = secrets[source["secretName"]]["stringData"]
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                local = root / mount["mountPath"].lstrip("/") / item["path"]
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(data[item["key"]])
                mounted[f"{mount['mountPath']}/{item['path']}"] = local
    return mounted


def settings_environment(container_spec: dict[str, Any], files: dict[str, Path]) -> dict[str, str]:
    """The container's environment as the process sees it: literal values, and every
    *_FILE setting pointing at the mounted (example) secret file. Values from the
    downward API get a stand-in (the pod's name)."""
    env: dict[str, str] = {}
    for item in container_spec.get("env", []):
        if "value" in item:
            value = str(item["value"])
            if item["name"].endswith("_FILE"):
                assert value in files, f"{item['name']}={value} is no mounted secret file"
                value = str(files[value])
            env[item["name"]] = value
        else:
            env[item["name"]] = "awp-pod-0"
    return env


def longest_worker_stop(config: WorkerConfig) -> float:
    """From SIGTERM to exit at most (worker/awp_worker/_shutdown.py): the drain
    (--shutdown-grace), then the hand-back of what still runs: the claim loop and
    the running actions cancelled (5 s each), computed results reported (up to 2 s),
    the side tasks stopped (5 s), the final Drain (max(5 s, --rpc-timeout))."""
    hand_back = 5 + 5 + min(2.0, config.rpc_timeout) + 5 + max(5.0, config.rpc_timeout)
    return config.shutdown_grace + hand_back
