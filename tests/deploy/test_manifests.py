"""The Kubernetes manifests in deploy/k8s: valid against a pinned Kubernetes version's
schemas (kubernetes-validate ships them, so this runs offline) and consistent with the
service's settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.files import K8S_DIR, SETTING_VARIABLES, k8s_documents

KUBERNETES_VERSION = "1.30.0"


def _resource(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in k8s_documents() if doc["kind"] == kind]
    return found


def _container() -> dict[str, Any]:
    (container,) = _resource("StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def _quantity_bytes(text: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|)", text)
    assert match, text
    return float(match[1]) * units[match[2]]


@pytest.mark.parametrize(
    ("path", "doc"), k8s_documents(), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_manifest_is_valid_kubernetes(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = {path.name for path, _ in k8s_documents()}
    present = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_three_servers_each_with_its_own_volume() -> None:
    statefulset = _resource("StatefulSet")
    spec = statefulset["spec"]
    assert spec["replicas"] == 3
    (claim,) = spec["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    service = _resource("Service")
    assert service["spec"]["clusterIP"] == "None"
    assert spec["serviceName"] == service["metadata"]["name"]


def test_probes_use_the_health_endpoints() -> None:
    container = _container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_each_pod_backs_up_under_its_own_prefix() -> None:
    env = _container()["env"]
    names = [e["name"] for e in env]
    # $(POD_NAME) expands only variables defined earlier in the list.
    assert names.index("POD_NAME") < names.index("RLREPLAY_BACKUP_URL")
    by_name = {e["name"]: e for e in env}
    assert by_name["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert by_name["RLREPLAY_BACKUP_URL"]["value"] == "s3://rlreplay-backups/$(POD_NAME)"
    assert _resource("ConfigMap")["data"]["RLREPLAY_RESTORE"] == "latest"


def test_settings_and_secrets_come_from_the_configmap_and_secret() -> None:
    sources = _container()["envFrom"]
    assert {"configMapRef": {"name": _resource("ConfigMap")["metadata"]["name"]}} in sources
    assert {"secretRef": {"name": _resource("Secret")["metadata"]["name"]}} in sources
    secret = _resource("Secret")["stringData"]
    assert {"RLREPLAY_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret)
    assert all(v.startswith("change-me") for v in secret.values()), "placeholders only"


def test_every_rlreplay_variable_is_a_setting() -> None:
    keys = set(_resource("ConfigMap")["data"]) | set(_resource("Secret")["stringData"])
    keys |= {e["name"] for e in _container()["env"]}
    unknown = {k for k in keys if k.startswith("RLREPLAY_")} - SETTING_VARIABLES
    assert not unknown, unknown


def test_memory_request_covers_the_cache() -> None:
    cache_mb = float(_resource("ConfigMap")["data"]["RLREPLAY_CACHE_MEMORY_LIMIT_MB"])
    resources = _container()["resources"]
    request = _quantity_bytes(resources["requests"]["memory"])
    limit = _quantity_bytes(resources["limits"]["memory"])
    cache = cache_mb * 2**20
    # docs/architecture.md: ~70 MB past the cache in the memory test, plus the index and
    # request buffers; the request leaves 0.5 to 2 GiB, the limit at least as much again.
    assert cache + 2**29 <= request <= cache + 2 * 2**30
    assert limit >= request


def test_pods_run_as_the_images_user() -> None:
    pod = _resource("StatefulSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
