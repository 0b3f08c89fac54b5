"""The Grafana dashboard queries only what a real server exports.

Starts a server with its Prometheus endpoint, sends traffic that touches
every instrument (served, queued, rejected), scrapes /metrics, and checks
every metric and label named by a panel or a template variable."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fairgate import AsyncClient, FairgateError

from service.settings import Settings
from service.telemetry.setup import build_telemetry
from tests.conftest import StartServer

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "deploy/observability/grafana/dashboards/fairgate.json"
)
PROMQL_WORDS = frozenset(
    {"sum", "rate", "irate", "increase", "histogram_quantile", "max", "min", "avg", "count"}
)
# Added by Prometheus to every scraped series, not by the server.
TARGET_LABELS = frozenset({"job", "instance"})
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ")
LABEL = re.compile(r'([a-zA-Z_]\w*)="')

TENANTS = """
tenants:
  - id: team-a
  - id: capped
    over_quota: wait
    quotas: {max_concurrent: 1, max_prompt_tokens: 8}
"""


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) that a PromQL expression refers to."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= set(re.findall(r"[a-zA-Z_]\w*", group))
    expr = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", expr)
    for group in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*[=!]", group))
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    metrics = {t for t in re.findall(r"[a-zA-Z_:][\w:]*", expr) if t not in PROMQL_WORDS}
    return metrics, labels


def dashboard_queries(dash: dict[str, Any]) -> tuple[set[str], set[str]]:
    metrics: set[str] = set()
    labels: set[str] = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            m, lb = promql_names(target["expr"])
            metrics |= m
            labels |= lb
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
            assert found, var["definition"]
            metrics.add(found.group(1))
            labels.add(found.group(2))
    return metrics, labels


def test_promql_names_parser() -> None:
    metrics, labels = promql_names(
        'histogram_quantile(0.99, sum by (le, fairgate_tenant) (rate(x_bucket{a=~"$t",b!="1"}'
        "[$__rate_interval]))) + sum(y)"
    )
    assert metrics == {"x_bucket", "y"} and labels == {"le", "fairgate_tenant", "a", "b"}


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    (ds_input,) = dash["__inputs"]
    assert ds_input["type"] == "datasource" and ds_input["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["current"]["value"] == "${" + ds_input["name"] + "}"
    # No hard-coded datasource anywhere: every panel and query uses the variable.
    refs = [p["datasource"] for p in dash["panels"]]
    refs += [t["datasource"] for p in dash["panels"] for t in p["targets"]]
    refs += [v["datasource"] for v in variables.values() if "datasource" in v]
    assert refs and all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs)


async def test_every_panel_queries_an_exported_metric(
    start_server: StartServer, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    telemetry = build_telemetry(Settings(metrics_listen="127.0.0.1:0"), {})
    app = await start_server(telemetry=telemetry, tenants_file=str(path), sim_time_scale=1.0)
    async with AsyncClient(app.address, tenant="team-a") as a:
        await a.complete("hello", max_tokens=5, ignore_eos=True)
    async with AsyncClient(app.address, tenant="capped") as c:
        # Two at once: one waits in the queue (max_concurrent 1).
        await asyncio.gather(*(c.complete("hi", max_tokens=3) for _ in range(2)))
        with pytest.raises(FairgateError):
            await c.complete("word " * 40, max_tokens=2)
    assert telemetry.metrics_endpoint is not None
    async with aiohttp.ClientSession() as http, http.get(telemetry.metrics_endpoint.url) as resp:
        text = await resp.text()
    exported: set[str] = set()
    exported_labels: set[str] = set()
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found and not line.startswith("#"):
            exported.add(found.group(1))
            exported_labels |= set(LABEL.findall(found.group(2) or ""))
    metrics, labels = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert metrics, "no metric found in the dashboard"
    assert sorted(metrics - exported) == [], "panels query metrics the server never exports"
    assert sorted(labels - exported_labels - TARGET_LABELS) == [], "unknown labels"
