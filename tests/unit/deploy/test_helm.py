"""The Helm chart (deploy/helm/fairgate), rendered by a real helm with every
value set CI validates (deploy/helm/ci/), checked against the server's code:
the settings it reads, its health service, its tenants-file loader.

deploy/validate.sh (test_manifests.py runs it) lints the chart and checks the
rendered objects against the Kubernetes schemas; this file checks what those
cannot: names, references and values that must agree with each other and
with the code."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from fairgate.bench.common import free_port

from scheduler.tenancy.tenant_file import load_tenants
from service.app import SERVICE_NAME
from service.settings import ENV_PREFIX, Settings
from tests.unit.deploy.k8s_checks import (
    Doc,
    check_images_pinned,
    check_network_policies,
    docs_by_key,
)

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "fairgate"
VALUE_SETS = sorted((DEPLOY / "helm" / "ci").glob("*.yaml"))
BIN = Path(sys.executable).parent
K8S_VERSION = "1.30.0"
RELEASE, NAMESPACE = "fg", "fairgate"

# Settings the chart cannot serve yet (docs/deployment.md "Not done yet"): files it does not mount
# and the in-process engine.
UNSUPPORTED = {
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "sglang_model_path",
    "sglang_engine_args",
    # One worker per pod: the HPA scales pods, and worker i's metrics port
    # (port + i) would need a ServiceMonitor endpoint each.
    "workers",
}
# Non-settings variables the pod may carry.
HELPER_ENV = {"REDIS_PASSWORD", "POD_NAME"}
OTEL_ENV = {
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
}


@pytest.fixture(scope="module")
def helm() -> str:
    proc = subprocess.run(
        ["bash", str(DEPLOY / "tools" / "install-helm.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"no helm: deploy/tools/install-helm.sh failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def _template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            helm,
            "template",
            RELEASE,
            str(CHART),
            "-n",
            NAMESPACE,
            "--kube-version",
            K8S_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _render(helm: str, *args: str) -> dict[str, Doc]:
    proc = _template(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return docs_by_key([proc.stdout])


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, tuple[dict[str, Any], dict[str, Doc]]]:
    """Value-set name → (its values, the chart rendered with them)."""
    return {
        p.stem: (yaml.safe_load(p.read_text()) or {}, _render(helm, "-f", str(p)))
        for p in VALUE_SETS
    }


def _gateway(docs: dict[str, Doc]) -> Doc:
    (deploy,) = [d for d in docs.values() if d["kind"] == "Deployment"]
    return deploy


def _container(workload: Doc) -> Doc:
    containers: list[Doc] = workload["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def _pod_env(
    docs: dict[str, Doc], secrets: dict[tuple[str, str], str] | None = None
) -> dict[str, str]:
    """The gateway container's environment as the kubelet builds it: envFrom
    ConfigMaps, then env (secretKeyRefs from `secrets`, or placeholders, and
    $(VAR) expanded from the variables before it)."""
    container = _container(_gateway(docs))
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        env.update(docs[f"ConfigMap/{source['configMapRef']['name']}"]["data"])
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), var["value"])
        elif ref := var["valueFrom"].get("secretKeyRef"):
            key = (ref["name"], ref["key"])
            env[var["name"]] = (secrets or {}).get(key, f"secret-{ref['name']}-{ref['key']}")
        else:
            env[var["name"]] = f"field-{var['name']}"
    return env


def test_chart_deploys_this_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_config_values_are_the_servers_settings(rendered: dict[str, Any]) -> None:
    """values.schema.json's `config` accepts exactly the settings the chart does
    not set itself, each with the type the server parses."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]
    assert config["additionalProperties"] is False
    types = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
    settings = {f.name: types[str(f.type)] for f in dataclasses.fields(Settings)}
    for name, prop in config["properties"].items():
        assert prop["type"] == settings[name], name
    # What the chart sets itself, seen in the renders, and never also in `config`.
    owned = {
        name.removeprefix(ENV_PREFIX).lower()
        for values, docs in rendered.values()
        for name in _pod_env(docs)
        if name.startswith(ENV_PREFIX)
        and name.removeprefix(ENV_PREFIX).lower() not in values.get("config", {})
    } - set(yaml.safe_load((CHART / "values.yaml").read_text())["config"])
    assert not owned & set(config["properties"])
    assert owned | set(config["properties"]) | UNSUPPORTED == set(settings)


def test_pod_env_names_are_settings_the_server_reads(rendered: dict[str, Any]) -> None:
    known = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
    for name, (_, docs) in rendered.items():
        env = _pod_env(docs)
        unknown = set(env) - known - HELPER_ENV - OTEL_ENV
        assert not unknown, (name, unknown)


def test_pods_start_with_valid_settings(rendered: dict[str, Any]) -> None:
    for name, (values, docs) in rendered.items():
        env = _pod_env(docs)
        settings = Settings.from_env({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
        assert (settings.engine, settings.store) == ("sglang-http", "redis"), name
        # FAIRGATE_REPLICAS: the most pods the fleet may have (fail-open limits divide by it).
        hpa = docs.get(f"HorizontalPodAutoscaler/{RELEASE}-fairgate")
        expected = hpa["spec"]["maxReplicas"] if hpa else _gateway(docs)["spec"]["replicas"]
        assert settings.replicas == expected, name
        for key, value in values.get("config", {}).items():
            assert getattr(settings, key) == value, (name, key)
        if values.get("auth", {}).get("adminApi", {}).get("enabled", True):
            assert settings.admin_token
        else:
            assert "FAIRGATE_ADMIN_TOKEN" not in env


def test_engine_urls_name_every_engine_pod(rendered: dict[str, Any]) -> None:
    for name, (values, docs) in rendered.items():
        urls = Settings.from_env(
            {k: v for k, v in _pod_env(docs).items() if k.startswith(ENV_PREFIX)}
        ).sglang_urls.split(",")
        engines = [
            d
            for d in docs.values()
            if d["kind"] == "StatefulSet" and "engine" in d["metadata"]["name"]
        ]
        if values.get("engine", {}).get("mode") == "external":
            assert urls == values["engine"]["external"]["urls"] and not engines
            continue
        (sts,) = engines
        service = docs[f"Service/{sts['spec']['serviceName']}"]["spec"]
        assert service["clusterIP"] == "None"
        assert service["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        port = service["ports"][0]["port"]
        assert _container(sts)["ports"][0]["containerPort"] == port
        pods = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
        host = f"{sts['spec']['serviceName']}.{NAMESPACE}.svc"
        assert urls == [f"http://{pod}.{host}:{port}" for pod in pods], name


def test_redis_password_comes_from_one_secret(rendered: dict[str, Any]) -> None:
    for _name, (values, docs) in rendered.items():
        fg_env = {e["name"]: e for e in _container(_gateway(docs))["env"]}
        ref = fg_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        env = _pod_env(docs, secrets={(ref["name"], ref["key"]): "pw0123"})
        url = Settings.from_env({"FAIRGATE_REDIS_URL": env["FAIRGATE_REDIS_URL"]}).redis_url
        if values.get("redis", {}).get("enabled", True):
            redis = _container(docs[f"StatefulSet/{RELEASE}-fairgate-redis"])
            args = redis["args"]
            assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
            redis_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
            assert redis_env["REDIS_PASSWORD"] == redis_env["REDISCLI_AUTH"] == ref
            secret = docs[f"Secret/{ref['name']}"]
            assert ref["key"] in secret["data"]
            assert url == f"redis://:pw0123@{RELEASE}-fairgate-redis.{NAMESPACE}.svc:6379/0"
        else:
            ext = values["externalRedis"]
            assert ref == {"name": ext["existingSecret"], "key": ext["existingSecretPasswordKey"]}
            scheme = "rediss" if ext.get("tls") else "redis"
            assert url == f"{scheme}://:pw0123@{ext['host']}:{ext['port']}/{ext['db']}"


def test_images_pinned_and_network_policies_fit(rendered: dict[str, Any]) -> None:
    for _name, (values, docs) in rendered.items():
        check_images_pinned(docs)
        if values.get("networkPolicy", {}).get("enabled", True):
            check_network_policies(docs)
        else:
            assert not any(d["kind"] == "NetworkPolicy" for d in docs.values())


def test_services_probes_and_drain(rendered: dict[str, Any]) -> None:
    for name, (values, docs) in rendered.items():
        deploy = _gateway(docs)
        pod = deploy["spec"]["template"]["spec"]
        container = _container(deploy)
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert container["readinessProbe"]["grpc"] == {"port": 50051, "service": SERVICE_NAME}
        assert container["livenessProbe"]["grpc"] == {"port": 50051}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = _pod_env(docs)
        assert ports["grpc"] == int(env["FAIRGATE_LISTEN"].rsplit(":", 1)[1])
        assert ports["metrics"] == int(env["FAIRGATE_METRICS_LISTEN"].rsplit(":", 1)[1])
        # The pod outlives the server's shutdown grace plus the preStop pause.
        pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
        grace = Settings.from_env({"FAIRGATE_SHUTDOWN_GRACE_S": env["FAIRGATE_SHUTDOWN_GRACE_S"]})
        assert pod["terminationGracePeriodSeconds"] > grace.shutdown_grace_s + pause
        services = [d for d in docs.values() if d["kind"] == "Service"]
        gateway = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        headless = [s for s in gateway if s["spec"].get("clusterIP") == "None"]
        enabled = values.get("service", {}).get("headless", {}).get("enabled", True)
        assert len(headless) == (1 if enabled else 0), name
        for svc in gateway:
            for port in svc["spec"]["ports"]:
                assert port["targetPort"] in ports, (name, port)
        if pdb := docs.get(f"PodDisruptionBudget/{RELEASE}-fairgate"):
            assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # The `helm test` pod asks a Service for the inference service's health.
        (test_pod,) = [d for d in docs.values() if d["kind"] == "Pod"]
        args = _container({"spec": {"template": {"spec": test_pod["spec"]}}})["args"]
        assert f"--service={SERVICE_NAME}" in args
        address = next(a for a in args if a.startswith("--address="))
        svc_name = address.split("=", 1)[1].split(".", 1)[0]
        assert any(s["metadata"]["name"] == svc_name for s in gateway)


def test_service_monitor_scrapes_each_pod_once(rendered: dict[str, Any]) -> None:
    monitors = 0
    for name, (values, docs) in rendered.items():
        monitor = docs.get(f"ServiceMonitor/{RELEASE}-fairgate")
        if not values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
            assert monitor is None, name
            continue
        monitors += 1
        spec = monitor["spec"]
        assert (
            values["metrics"]["serviceMonitor"]["labels"].items()
            <= monitor["metadata"]["labels"].items()
        )
        services = [
            d
            for d in docs.values()
            if d["kind"] == "Service"
            and spec["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()
        ]
        (service,) = services  # one Service: each pod scraped once
        assert spec["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
    assert monitors  # some value set turns it on


def test_seeded_tenants_load_in_the_server(rendered: dict[str, Any], tmp_path: Path) -> None:
    values, docs = rendered["observability"]
    cm = docs[f"ConfigMap/{RELEASE}-fairgate-tenants"]
    path = tmp_path / "tenants.yaml"
    path.write_text(cm["data"]["tenants.yaml"])
    registry = load_tenants(str(path))
    assert {t.tenant_id for t in registry} == {t["id"] for t in values["tenants"]["tenants"]}
    assert registry.default_tenant_id == values["tenants"]["default_tenant"]
    mount = next(m for m in _container(_gateway(docs))["volumeMounts"] if m["name"] == "tenants")
    assert _pod_env(docs)["FAIRGATE_TENANTS_FILE"] == f"{mount['mountPath']}/tenants.yaml"


def test_explicit_and_generated_secrets(helm: str) -> None:
    explicit = _render(helm, "--set", "auth.apiKeyPepper=0123456789abcdef-pepper")
    data = explicit[f"Secret/{RELEASE}-fairgate"]["data"]
    assert base64.b64decode(data["api-key-pepper"]).decode() == "0123456789abcdef-pepper"
    generated = _render(helm)[f"Secret/{RELEASE}-fairgate"]["data"]
    for key in ("api-key-pepper", "admin-token"):
        value = base64.b64decode(generated[key]).decode()
        Settings(api_key_pepper=value).validate()  # >= 16 bytes
        assert len(value) >= 32
    # With an existing Secret the chart makes none and the pods read that one.
    existing = _render(helm, "--set", "auth.existingSecret=mine")
    assert f"Secret/{RELEASE}-fairgate" not in existing
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in _container(_gateway(existing))["env"]
        if e["name"] in ("FAIRGATE_API_KEY_PEPPER", "FAIRGATE_ADMIN_TOKEN")
    }
    assert refs == {"mine"}


def test_validators_catch_a_broken_render(helm: str, tmp_path: Path) -> None:
    """What validate.sh runs on each render fails on a misspelt field, in a
    built-in object and in a ServiceMonitor, and on a custom kind it has no
    schema for."""
    proc = _template(helm, "--set", "metrics.serviceMonitor.enabled=true")
    assert proc.returncode == 0, proc.stderr
    good = proc.stdout

    def validate(text: str) -> int:
        src = tmp_path / "rendered.yaml"
        src.write_text(text)
        split = subprocess.run(
            [
                sys.executable,
                str(DEPLOY / "tools" / "split_manifests.py"),
                str(src),
                str(tmp_path / "out"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if split.returncode:
            return split.returncode
        rc = subprocess.run(
            [
                str(BIN / "kubernetes-validate"),
                "--strict",
                "--quiet",
                "-k",
                K8S_VERSION,
                str(tmp_path / "out" / "builtin.yaml"),
            ],
            capture_output=True,
            check=False,
        ).returncode
        for line in split.stdout.splitlines():
            schema, file = line.split("\t")
            rc |= subprocess.run(
                [str(BIN / "check-jsonschema"), "--schemafile", schema, file],
                capture_output=True,
                check=False,
            ).returncode
        return rc

    assert validate(good) == 0
    assert validate(good.replace("revisionHistoryLimit:", "revisionHistoryLimt:", 1)) != 0
    assert validate(good.replace("scrapeTimeout:", "scrapeTimout:", 1)) != 0
    assert validate(good.replace("kind: ServiceMonitor", "kind: PodMonitor", 1)) != 0


def test_wait_for_engine_holds_the_pod_until_an_engine_answers(rendered: dict[str, Any]) -> None:
    """The init container's program, run as rendered: it waits while no engine
    answers /health and finishes once a real `fairgate sim-server` does."""
    _, docs = rendered["defaults"]
    pod = _gateway(docs)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["envFrom"] == _container(_gateway(docs))["envFrom"]  # reads FAIRGATE_SGLANG_URLS
    assert init["command"][:2] == ["python", "-c"]
    dead, live = free_port(), free_port()
    urls = f"http://127.0.0.1:{dead},http://127.0.0.1:{live}"
    waiter = subprocess.Popen(
        [sys.executable, "-c", init["command"][2]],
        env={**os.environ, "FAIRGATE_SGLANG_URLS": urls},
        stdout=subprocess.PIPE,
        text=True,
    )
    server = None
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline().startswith("waiting for an engine;")
        server = subprocess.Popen(
            [sys.executable, "-m", "fairgate.cli.main", "sim-server", "--port", str(live)],
            stdin=subprocess.PIPE,  # it exits when its stdin closes
            stdout=subprocess.DEVNULL,
        )
        out, _ = waiter.communicate(timeout=120)
        assert waiter.returncode == 0
        assert f"engine ready: http://127.0.0.1:{live}" in out
    finally:
        for proc in (waiter, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
