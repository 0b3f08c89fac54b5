"""Checks shared by the plain manifests' tests and the Helm chart's: how the
Kubernetes objects fit together (one place per rule)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import yaml

Doc = dict[str, Any]


def docs_by_key(texts: Iterable[str]) -> dict[str, Doc]:
    """`Kind/name` → object, over YAML streams (empty documents dropped)."""
    out: dict[str, Doc] = {}
    for text in texts:
        for d in yaml.safe_load_all(text):
            if d:
                out[f"{d['kind']}/{d['metadata']['name']}"] = d
    return out


def pod_specs(docs: dict[str, Doc]) -> Iterator[tuple[str, Doc]]:
    """Every pod spec: workloads' templates and bare pods (e.g. `helm test` hooks)."""
    for key, doc in docs.items():
        if doc["kind"] == "Pod":
            yield key, doc["spec"]
        elif pod := doc.get("spec", {}).get("template", {}).get("spec"):
            yield key, pod


def image_is_pinned(image: str) -> bool:
    """A digest, or a tag other than `latest` (no tag means latest)."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def check_images_pinned(docs: dict[str, Doc]) -> None:
    for key, pod in pod_specs(docs):
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert image_is_pinned(c["image"]), (key, c["image"])


def check_network_policies(docs: dict[str, Doc]) -> None:
    """Every policy selects one workload's pods and names ports those pods have;
    every pod peer selects pods (a workload's, or a bare pod such as a test hook)."""
    pods: list[tuple[dict[str, str], Doc]] = []  # (labels, pod spec)
    for doc in docs.values():
        if doc["kind"] == "Pod":
            pods.append((doc["metadata"]["labels"], doc["spec"]))
        elif doc["kind"] in ("Deployment", "StatefulSet"):
            template = doc["spec"]["template"]
            pods.append((template["metadata"]["labels"], template["spec"]))

    def selected(match: dict[str, str]) -> list[Doc]:
        return [spec for labels, spec in pods if match.items() <= labels.items()]

    policies = [d for d in docs.values() if d["kind"] == "NetworkPolicy"]
    assert policies
    for policy in policies:
        (pod,) = selected(policy["spec"]["podSelector"]["matchLabels"])
        (container,) = pod["containers"]
        port_names = {p["name"] for p in container["ports"]}
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                assert port["port"] in port_names, (policy["metadata"]["name"], port)
            for peer in rule.get("from", []):
                if "podSelector" in peer:
                    assert selected(peer["podSelector"]["matchLabels"]), peer
