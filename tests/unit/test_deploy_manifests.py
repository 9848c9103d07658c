"""The deployment files (deploy/): the Kustomize base rendered by kubectl and every resource
validated offline against the Kubernetes schemas (kubernetes-validate, strict: an unknown field is
an error); the KServe resources checked against KServe's own SDK models (tests/e2e/kserve_manifests.py
in .venv-kserve); and what the files promise each other: the server's flags parse, the shutdown
fits the pod's grace period, whole CPUs with requests equal to limits, probes on the health routes."""

import argparse
import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from lumenrt.ingress.serve import add_arguments

ROOT = Path(__file__).parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"
KSERVE = ROOT / "deploy" / "kserve"
KSERVE_PYTHON = ROOT / ".venv-kserve" / "bin" / "python"
K8S_VERSION = "1.32"  # the schemas checked against (kubectl here is 1.32)


def base_resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [yaml.safe_load((BASE / name).read_text()) for name in kustomization["resources"]]


def serve_args(container: dict[str, Any]) -> argparse.Namespace:
    args = container["args"]
    assert args[0] == "serve"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(args[1:])  # a flag that lumenrt serve does not have fails here


def test_every_base_resource_validates_strictly() -> None:
    resources = base_resources()
    assert sorted(r["kind"] for r in resources) == [
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Service",
    ]
    for doc in resources:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deployment = next(r for r in resources if r["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl (Debian: apt-get install kubectl)")
def test_the_kustomize_base_renders_and_validates() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(BASE)], capture_output=True, text=True, timeout=60, check=True
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(docs) == 4
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "lumenrt"
    service = next(d for d in docs if d["kind"] == "Service")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def containers() -> list[tuple[str, dict[str, Any], int]]:
    """(where, container, the pod's grace period) of the Deployment and the KServe runtime."""
    deployment = next(r for r in base_resources() if r["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    runtime = yaml.safe_load((KSERVE / "clusterservingruntime.yaml").read_text())
    return [
        ("Deployment", pod["containers"][0], pod["terminationGracePeriodSeconds"]),
        ("ClusterServingRuntime", runtime["spec"]["containers"][0], 30),  # Kubernetes' default
    ]


@pytest.mark.parametrize("where", ["Deployment", "ClusterServingRuntime"])
def test_the_server_flags_fit_the_pod(where: str) -> None:
    _, container, grace_period = next(c for c in containers() if c[0] == where)
    args = serve_args(container)
    assert args.host == "0.0.0.0"  # reachable from the pod's network
    assert args.drain_delay_s + args.grace_s < grace_period  # SIGKILL never cuts the drain short
    assert args.log_format == "json"
    ports = {p["containerPort"] for p in container["ports"]}
    assert {args.http_port, args.grpc_port} <= ports
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    assert str(resources["limits"]["cpu"]).isdigit()  # whole CPUs: the static CPU manager's exclusive cores
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    if where == "ClusterServingRuntime":
        assert container["name"] == "kserve-container" and args.model_dir == Path("/mnt/models")
        assert args.model_name == "{{.Name}}"  # KServe fills in the InferenceService's name
        assert (args.http_port, args.grpc_port) == (8080, 8081)
        assert {p.get("name") for p in container["ports"]} >= {"h2c"}


@pytest.mark.skipif(not KSERVE_PYTHON.exists(), reason="no .venv-kserve (make install creates it)")
def test_kserve_resources_match_the_kserve_sdk_models(tmp_path: Path) -> None:
    files = sorted(KSERVE.glob("*.yaml"))
    assert len(files) == 4  # the runtime and an InferenceService per format
    broken = tmp_path / "broken.yaml"
    doc = yaml.safe_load((KSERVE / "inferenceservice-onnx.yaml").read_text())
    doc["spec"]["predictor"]["model"]["protocolVersions"] = doc["spec"]["predictor"]["model"].pop(
        "protocolVersion"
    )
    broken.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [str(KSERVE_PYTHON), str(ROOT / "tests" / "e2e" / "kserve_manifests.py"), *map(str, files), str(broken)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert {Path(f).name: r for f, r in result.items() if f != str(broken)} == {f.name: "ok" for f in files}
    assert "protocolVersions: no such field in V1beta1ModelSpec" in result[str(broken)]
    for f in files[1:]:
        isvc = yaml.safe_load(f.read_text())
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
        (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
        assert "nv_inference_pending_request_count" in metric["external"]["metric"]["query"]


def test_the_image_runs_lumenrt_serve_with_flags_it_has() -> None:
    """The Dockerfile's entry point and default command: ``lumenrt`` + ``serve ...`` with flags that
    parse, as the manifests give them (what the image runs is tested outside a container by
    tests/e2e/test_plain_install.py: a fresh venv, ``pip install .``, ``lumenrt serve``)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    entry = next(
        json.loads(line.split(None, 1)[1]) for line in text.splitlines() if line.startswith("ENTRYPOINT")
    )
    command = next(json.loads(line.split(None, 1)[1]) for line in text.splitlines() if line.startswith("CMD"))
    assert entry == ["lumenrt"]
    args = serve_args({"args": command})
    assert (args.host, args.http_port, args.grpc_port, args.repository) == (
        "0.0.0.0",
        8080,
        8081,
        Path("/models"),
    )
    assert "USER 10001" in text and text.count("FROM ") == 2  # non-root; build and runtime stages
    runtime_stage = text.split("FROM ${BASE}\n", 1)[1]
    assert (
        "gcc" not in runtime_stage and "pip install" not in runtime_stage
    )  # no compilers in the final image
