"""Deployment files: real validators (offline schemas from the dev extra) and
the cross-references between the manifests and the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from service.grpc_server import SERVICE_NAME
from tests.unit.deploy.k8s_checks import check_images_pinned, check_network_policies

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
        timeout=600,  # the first run downloads helm (deploy/tools/install-helm.sh)
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
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == port
    # The OpenAI HTTP front: the container port and both Services' targets.
    assert ports["http"] == int(config["FAIRGATE_HTTP_LISTEN"].rsplit(":", 1)[1])
    for svc in ("Service/fairgate", "Service/fairgate-headless"):
        assert {p["name"]: p["targetPort"] for p in docs[svc]["spec"]["ports"]}["http"] == "http"
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


def _compose_default(value: str) -> str:
    """ "${NAME:-default}" → default (what compose uses when NAME is unset)."""
    import re

    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_replicas_use_the_stand_in_with_admin_on() -> None:
    from service.settings import Settings

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    redis_cmd = [_compose_default(x) for x in services["redis"]["command"]]
    password = redis_cmd[redis_cmd.index("--requirepass") + 1]
    for name in ("fairgate-1", "fairgate-2"):
        env = {k: _compose_default(str(v)) for k, v in services[name]["environment"].items()}
        # The settings the replica starts with are valid, and point at the stand-in.
        settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("FAIRGATE_")})
        assert settings.engine == "sglang-http"
        assert settings.sglang_urls == "http://sglang:30000"
        assert settings.admin_token
        assert settings.redis_url == f"redis://:{password}@redis:6379/0"
        assert services[name]["depends_on"]["sglang"]["condition"] == "service_healthy"
        # Both fronts published on loopback: gRPC and the OpenAI HTTP port.
        published = {p.rsplit(":", 1)[1] for p in services[name]["ports"]}
        assert published == {
            settings.listen.rsplit(":", 1)[1],
            settings.http_listen.rsplit(":", 1)[1],
        }
    assert services["sglang"]["command"][0] == "sim-server"
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == services["redis"]["command"][2]


def test_compose_in_process_option_is_one_gpu_with_valid_settings() -> None:
    from service.settings import Settings
    from service.sglang_inproc_build import engine_kwargs

    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service = compose["services"]["fairgate-inproc"]
    assert service["profiles"] == ["gpu-inproc"]  # off unless asked for
    assert service["build"]["dockerfile"] == "deploy/Dockerfile.sglang"
    assert (DEPLOY / "Dockerfile.sglang").is_file()
    env = {k: _compose_default(str(v)) for k, v in service["environment"].items()}
    # The image sets the listen addresses; the service sets the engine and its flags.
    settings = Settings.from_env(
        {k: v for k, v in env.items() if k.startswith("FAIRGATE_")},
        listen="0.0.0.0:50051",
        http_listen="0.0.0.0:8000",
    )
    kwargs = engine_kwargs(settings)
    assert settings.engine == "sglang" and settings.workers == 1
    assert kwargs["enable_priority_scheduling"] and kwargs["mem_fraction_static"] == 0.88
    (gpu,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert gpu["count"] == 1 and gpu["capabilities"] == ["gpu"]


def test_dockerignore_keeps_what_the_image_copies() -> None:
    ignored = {
        line.strip()
        for line in (DEPLOY.parent / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests"} <= ignored
    copied = [
        line.split()[1]
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    for path in copied:
        assert path.rstrip("/") not in ignored, path


def _all_k8s() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "k8s").rglob("*.yaml")):
        out.update(_docs(path))
    return out


def test_k8s_images_pinned_replicas_and_headless_service() -> None:
    docs = _all_k8s()
    check_images_pinned(docs)
    hpa = docs["HorizontalPodAutoscaler/fairgate"]["spec"]
    config = docs["ConfigMap/fairgate"]["data"]
    assert int(config["FAIRGATE_REPLICAS"]) == hpa["maxReplicas"]
    headless = docs["Service/fairgate-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    pod_labels = docs["Deployment/fairgate"]["spec"]["template"]["metadata"]["labels"]
    assert headless["selector"].items() <= pod_labels.items()


def test_k8s_redis_auth_network_policies_and_service_monitor() -> None:
    docs = _all_k8s()
    redis = docs["StatefulSet/redis"]["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][redis["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    redis_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    assert redis_secret["REDIS_PASSWORD"] == {"name": "redis", "key": "password"}
    assert "password" in docs["Secret/redis"]["stringData"]
    fg = docs["Deployment/fairgate"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in fg["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "redis",
        "key": "password",
    }
    assert env["FAIRGATE_REDIS_URL"]["value"].startswith("redis://:$(REDIS_PASSWORD)@redis.")
    # Every network policy selects real pods and names ports they have.
    policies = [d for k, d in docs.items() if k.startswith("NetworkPolicy/")]
    assert {p["metadata"]["name"] for p in policies} == {"fairgate", "redis", "sglang"}
    check_network_policies(docs)
    # The ServiceMonitor scrapes the headless Service's metrics port (one target per pod).
    monitor = docs["ServiceMonitor/fairgate"]["spec"]
    service = docs["Service/fairgate-headless"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert (
        not monitor["selector"]["matchLabels"].items()
        <= docs["Service/fairgate"]["metadata"]["labels"].items()
    )  # not both Services: each pod scraped once
    assert monitor["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
