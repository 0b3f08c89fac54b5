"""Deployment files: real validators (offline schemas from the dev extra) and
the cross-references between the manifests and the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from service.app import SERVICE_NAME

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
BIN = Path(sys.executable).parent


def _docs(path: Path) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(path.read_text())}


def test_validators_pass() -> None:
    proc = subprocess.run(
        ["bash", str(DEPLOY / "validate.sh")],
        env={**os.environ, "VENV_BIN": str(BIN)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_strict_validation_rejects_unknown_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((DEPLOY / "k8s" / "fairgate.yaml").read_text().replace("replicas:", "replica:"))
    proc = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", "1.30.0", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "replica" in proc.stdout + proc.stderr


def test_fairgate_manifest_matches_the_server() -> None:
    docs = _docs(DEPLOY / "k8s" / "fairgate.yaml")
    config = docs["ConfigMap/fairgate"]["data"]
    port = int(config["FAIRGATE_LISTEN"].rsplit(":", 1)[1])
    deploy = docs["Deployment/fairgate"]["spec"]
    pod = deploy["template"]["spec"]
    (container,) = pod["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"] == port
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": SERVICE_NAME}
    assert container["livenessProbe"]["grpc"] == {"port": port}
    # Drain: the pod outlives the server's shutdown grace plus the preStop pause.
    grace = float(config["FAIRGATE_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > grace + 5
    labels = deploy["template"]["metadata"]["labels"]
    for sel in (
        deploy["selector"]["matchLabels"],
        docs["Service/fairgate"]["spec"]["selector"],
        docs["PodDisruptionBudget/fairgate"]["spec"]["selector"]["matchLabels"],
    ):
        assert sel.items() <= labels.items()
    hpa = docs["HorizontalPodAutoscaler/fairgate"]["spec"]
    assert hpa["minReplicas"] > docs["PodDisruptionBudget/fairgate"]["spec"]["minAvailable"]


def test_sglang_runs_on_gpu_nodes() -> None:
    pod = _docs(DEPLOY / "k8s" / "sglang.yaml")["Deployment/sglang"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def test_compose_has_the_stack() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"redis", "fairgate-1", "fairgate-2", "sglang", "otel-collector", "prometheus"} <= set(
        services
    )
    assert "grafana" in services
    assert services["sglang"]["command"][0] == "sim-server"
    for mount in services["otel-collector"]["volumes"] + services["prometheus"]["volumes"]:
        source = mount.split(":", 1)[0]
        if source.startswith("./"):
            assert (DEPLOY / source).is_file(), source


def test_grafana_dashboard_is_provisioned_and_uses_our_metrics() -> None:
    import json

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert "./observability/grafana/dashboards:/etc/grafana/dashboards:ro" in mounts
    provider = yaml.safe_load(
        (DEPLOY / "observability/grafana/provisioning/dashboards/fairgate.yaml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
    # Which metrics the panels query is checked against a real server's
    # /metrics in tests/integration/test_dashboard.py.
    dash = json.loads((DEPLOY / "observability/grafana/dashboards/fairgate.json").read_text())
    assert dash["panels"] and all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    datasources = yaml.safe_load(
        (DEPLOY / "observability/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    scrape = yaml.safe_load((DEPLOY / "observability/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    targets = jobs["fairgate"]["static_configs"][0]["targets"]
    env = compose["services"]["fairgate-1"]["environment"]
    port = env["FAIRGATE_METRICS_LISTEN"].rsplit(":", 1)[1]
    assert targets == [f"fairgate-1:{port}", f"fairgate-2:{port}"]
