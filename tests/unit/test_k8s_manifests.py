"""The Kubernetes scale path, validated offline against a pinned Kubernetes version.

kubernetes-validate checks each object against the API's OpenAPI schema (strict: unknown
fields are errors); the rest checks what the schema cannot: probes on the right paths,
GPU requests, a non-root read-only container whose writable paths are volumes, settings
that the real CloudSettings accepts, and an HPA fed by a metric the cloud really exports.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import prometheus_client
import pytest
import yaml

from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.config import load_settings
from tests.support.docker_files import (
    IMAGES,
    assert_env_sets_real_settings,
    declared_volumes,
    final_env,
)

K8S = Path(__file__).resolve().parents[2] / "docker" / "x86" / "k8s"
KUBERNETES_VERSION = "1.31.0"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


DOCS = _documents()


def _one(kind: str, name: str = "edgefleet-cloud") -> dict[str, Any]:
    found = [d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def _container() -> dict[str, Any]:
    return _one("StatefulSet")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_manifest_is_valid_for_the_pinned_kubernetes(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_a_broken_manifest() -> None:
    broken = yaml.safe_load(yaml.safe_dump(_one("StatefulSet")))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(_one("StatefulSet")))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_of_the_namespace() -> None:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == files - {"prometheus-adapter-rules.yaml"}
    for name, doc in DOCS:
        if not name.startswith("prometheus-adapter") and doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "edgefleet", name


def test_orchestrator_runs_replicas_with_health_probes_and_a_gpu() -> None:
    deployment = _one("StatefulSet")
    assert deployment["spec"]["replicas"] >= 2
    container = _container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1
    assert {"cpu", "memory"} <= set(resources["requests"])
    # the port the probes use is the one the image serves on
    port = int(final_env("x86-cloud")["EDGEFLEET_CLOUD_HTTP__PORT"])
    assert container["ports"][0]["containerPort"] == port


def test_orchestrator_is_non_root_with_a_read_only_root_filesystem() -> None:
    pod = _one("StatefulSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = _container()["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def test_every_writable_path_of_the_image_is_a_volume_mount() -> None:
    mounts = {PurePosixPath(m["mountPath"]): m for m in _container()["volumeMounts"]}
    for path in declared_volumes("x86-cloud"):
        assert path in mounts, f"VOLUME {path} is not mounted (read-only root filesystem)"
        assert not mounts[path].get("readOnly", False)
    assert mounts[PurePosixPath("/etc/edgefleet")]["readOnly"] is True


def test_configuration_is_accepted_by_the_real_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _one("ConfigMap")["data"]
    cloud_yaml = tmp_path / "cloud.yaml"
    cloud_yaml.write_text(data["cloud.yaml"])
    monkeypatch.chdir(tmp_path)
    settings = load_settings(CloudSettings, cloud_yaml)
    assert settings.ingest.share_group is None  # derived from the broker password
    assert settings.ingest.session_expiry_s <= 600
    env = {k: v for k, v in data.items() if k != "cloud.yaml"}
    env["EDGEFLEET_CLOUD_INGEST__CLIENT_ID"] = (
        "edgefleet-cloud-0"  # what the downward API gives each pod
    )
    assert assert_env_sets_real_settings(IMAGES["x86-cloud"], env, monkeypatch) == len(env)
    # variables from the Secret: their names must be settings too (values are not here)
    secret_env = {
        "EDGEFLEET_CLOUD_MQTT__PASSWORD": "x",
        "EDGEFLEET_CLOUD_DATABASE_URL": "sqlite:///x.db",
    }
    for item in _container()["env"]:
        if "secretKeyRef" in item["valueFrom"]:
            secret_env[item["name"]] = secret_env[item["valueFrom"]["secretKeyRef"]["key"]]
    assert set(secret_env) == {
        "EDGEFLEET_CLOUD_MQTT__PASSWORD",
        "EDGEFLEET_CLOUD_DATABASE_URL",
        "EDGEFLEET_FLEET_DATABASE_URL",
    }
    assert assert_env_sets_real_settings(IMAGES["x86-cloud"], secret_env, monkeypatch) == 3
    sources = {next(iter(s)) for s in _container()["envFrom"]}
    assert sources == {"configMapRef", "secretRef"}


def test_autoscaling_follows_queue_depth_exported_by_the_cloud() -> None:
    hpa = _one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "edgefleet-cloud"
    metrics = hpa["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Pods"]  # not CPU
    metric = metrics[0]["pods"]["metric"]["name"]
    # the cloud really exports this gauge on /metrics
    importlib.import_module("edgefleet.cloud.processor")
    exported = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert metric in exported
    # and the adapter rule turns that series into the metric the HPA asks for
    rules = yaml.safe_load(_one("ConfigMap", "adapter-config")["data"]["config.yaml"])["rules"]
    rule = next(r for r in rules if r["name"]["as"] == metric)
    assert rule["seriesQuery"].startswith(metric + "{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_service_and_pdb_select_the_orchestrator_pods() -> None:
    labels = _one("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    service = _one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == _container()["ports"][0]["name"]
    pdb = _one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    claims = {
        d["metadata"]["name"]
        for _, d in DOCS
        if d["kind"] == "PersistentVolumeClaim"
        and d["metadata"]["labels"]["app.kubernetes.io/name"] == "edgefleet-cloud"
    }
    volumes = _one("StatefulSet")["spec"]["template"]["spec"]["volumes"]
    used = {
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    }
    assert used == claims
    # every mount is a volume of the pod or one of the replica's own claims
    templates = {t["metadata"]["name"] for t in _one("StatefulSet")["spec"]["volumeClaimTemplates"]}
    names = {v["name"] for v in volumes} | templates
    assert {m["name"] for m in _container()["volumeMounts"]} == names


def test_a_replica_keeps_its_mqtt_identity_across_a_restart() -> None:
    # a StatefulSet pod is named edgefleet-cloud-<n> again after a crash: its client id
    # (the pod name) resumes its session instead of leaving an orphan in the share group
    stateful = _one("StatefulSet")
    env = {e["name"]: e for e in _container()["env"]}
    ref = env["EDGEFLEET_CLOUD_INGEST__CLIENT_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.name"
    governing = _one("Service", stateful["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    assert _one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"


def _claims(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Every claim (PVCs and StatefulSet claim templates) -> its access modes."""
    out = {}
    for doc in docs:
        if doc["kind"] == "PersistentVolumeClaim":
            out[doc["metadata"]["name"]] = doc["spec"]["accessModes"]
        for template in doc.get("spec", {}).get("volumeClaimTemplates", []):
            out[f"{template['metadata']['name']} (per replica)"] = template["spec"]["accessModes"]
    return out


def test_no_claim_asks_read_write_many_by_default() -> None:
    # default storage classes (EBS, PD, Azure Disk, local-path) offer ReadWriteOnce only: a
    # ReadWriteMany claim stays Pending and the pods never start
    claims = _claims([d for _, d in DOCS])
    assert claims, "the orchestrator keeps no data"
    assert {name: modes for name, modes in claims.items() if "ReadWriteMany" in modes} == {}
    # each replica its own store files and engine cache, kept across restarts
    mounts = {m["name"]: m["mountPath"] for m in _container()["volumeMounts"]}
    assert mounts["data"] == "/var/lib/edgefleet/data"
    assert mounts["engines"] == "/var/cache/edgefleet/engines"
    assert set(claims) >= {"data (per replica)", "engines (per replica)"}


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("needs kubectl (kustomize) to render the component")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def test_the_shared_rwx_component_puts_images_and_models_on_one_shared_claim(
    tmp_path: Path,
) -> None:
    base = _kustomize(K8S)
    assert not [m for m in _claims(base).values() if "ReadWriteMany" in m]
    # given the component switched on as the kustomization's comment says
    overlay = tmp_path / "k8s"
    shutil.copytree(K8S, overlay)
    text = (overlay / "kustomization.yaml").read_text()
    text = text.replace("# components:\n#   - shared-rwx", "components:\n  - shared-rwx")
    (overlay / "kustomization.yaml").write_text(text)
    docs = _kustomize(overlay)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert _claims(docs)["edgefleet-cloud-shared"] == ["ReadWriteMany"]
    stateful = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = stateful["spec"]["template"]["spec"]
    shared = {
        v["name"]
        for v in pod["volumes"]
        if v.get("persistentVolumeClaim", {}).get("claimName") == "edgefleet-cloud-shared"
    }
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    # the cloud's data_dir/images and data_dir/models, shared; the rest stays per replica
    data_dir = PurePosixPath(final_env("x86-cloud")["EDGEFLEET_CLOUD_DATA_DIR"])
    assert mounts[str(data_dir / "images")] in shared
    assert mounts[str(data_dir / "models")] in shared
    assert mounts[str(data_dir)] == "data"


def test_triton_serves_beside_the_orchestrator_on_a_gpu() -> None:
    deployment = _one("Deployment", "edgefleet-triton")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("nvcr.io/nvidia/tritonserver:")
    assert "--model-repository=/models" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = _one("Service", "edgefleet-triton")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for _, d in DOCS if d["kind"] == "PersistentVolumeClaim"}
