"""Every Kubernetes manifest in deploy/ is valid against the Kubernetes OpenAPI schemas
(offline: the kubernetes-validate package ships them), strictly (an unknown or
misspelt field is an error), at the oldest Kubernetes version deploy/README.md
supports and at a current one; and the kustomizations name every manifest."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest

from deploy.manifests import (
    KEDA,
    KUBERNETES,
    KUSTOMIZATIONS,
    SECRETS_EXAMPLE,
    Manifest,
    documents,
    find,
    objects,
)

# The oldest version deploy/README.md promises (native gRPC probes are GA from 1.27,
# the restricted Pod Security Standard's checks as used here from 1.25), and a current
# one; both pinned, as the package's schemas are.
KUBERNETES_VERSIONS = ("1.29.0", "1.34.0")
# Custom resources: the API server has no schema for them until their operator is
# installed; test_couplings checks the ScaledObject's fields.
CUSTOM = {"keda.sh/v1alpha1"}


def api_objects() -> list[tuple[Path, Manifest]]:
    return [(path, doc) for path, doc in objects() if doc["apiVersion"] not in CUSTOM]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(version: str) -> None:
    checked = []
    for path, doc in api_objects():
        kubernetes_validate.validate(doc, version, strict=True)
        checked.append(f"{path.relative_to(KUBERNETES)}:{doc['kind']}/{doc['metadata']['name']}")
    kinds = {doc["kind"] for _, doc in api_objects()}
    assert kinds >= {
        "Namespace", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "Job",
        "Secret",
    }  # fmt: skip
    print(f"\nFIGURE {len(checked)} objects valid for Kubernetes {version}")


def test_the_validation_refuses_what_kubernetes_would() -> None:
    """The check can fail: a misspelt field and a wrong type are both caught."""
    server = find("Deployment", "awp-server")
    misspelt = copy.deepcopy(server)
    misspelt["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    wrong_type = copy.deepcopy(server)
    wrong_type["spec"]["replicas"] = "two"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def _kustomization(path: Path) -> Manifest:
    (doc,) = documents(path)
    assert doc["kind"] == "Kustomization"
    return doc


def test_the_kustomizations_name_every_manifest_and_one_image() -> None:
    main, migrate = (_kustomization(path) for path in KUSTOMIZATIONS)
    listed = {KUBERNETES / name for name in main["resources"]}
    listed |= {KUBERNETES / "migrate" / name for name in migrate["resources"]}
    # Applied on their own, on purpose: placeholders, and a resource of an operator.
    apart = {SECRETS_EXAMPLE, KEDA}
    on_disk = {p for p in KUBERNETES.rglob("*.yaml") if p not in KUSTOMIZATIONS}
    assert listed == on_disk - apart
    assert main["namespace"] == migrate["namespace"] == find("Namespace", "awp")["metadata"]["name"]
    assert main["images"] == migrate["images"]
    (image,) = main["images"]
    names = {c["image"] for _, doc in objects() for c in _containers(doc)}
    assert names == {image["name"]}, "every container runs the one image"


def _containers(doc: Manifest) -> list[dict[str, object]]:
    template = doc.get("spec", {}).get("template")
    return list(template["spec"]["containers"]) if template else []
