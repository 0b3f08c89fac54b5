"""The operators' tables and the Helm chart's values schema, generated from the
declarations: the settings (service/settings.py) and the tenants file with its
quotas (scheduler/tenancy/tenants.py, tenant_check.py).

    python -m service.settings_doc           # rewrite them
    python -m service.settings_doc --check   # exit 1 when any drifted (CI)

The tables are the `## Settings` and `## Tenants file` sections of
docs/configuration.md (the rest of the page is prose, left alone); the schemas
are `properties.config.properties` and `properties.tenants` of
deploy/helm/fairgate/values.schema.json. tests/unit/service/test_settings_doc.py
fails when any differs from what this writes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from scheduler.tenancy.budgets import (
    BUDGET_REQUESTS_RANGE,
    BUDGET_TOKENS_RANGE,
    DEFAULT_WARN_AT,
    PERIODS,
    TOKEN_KINDS,
)
from scheduler.tenancy.tenant_check import PRIORITY_NAMES, TENANT_FIELD_DOCS
from scheduler.tenancy.tenants import (
    INTEGER_QUOTAS,
    MAX_TENANT_ID_CHARS,
    OVER_QUOTA_MODES,
    QUOTA_RANGES,
    TENANT_ID_PATTERN,
    WEIGHT_RANGE,
    TenantQuotas,
)
from service.settings import ENV_PREFIX, Settings
from service.settings_errors import allowed

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
HELM_SCHEMA = ROOT / "deploy" / "helm" / "fairgate" / "values.schema.json"
HEADING = "## Settings"
TENANTS_HEADING = "## Tenants file"

# What the chart sets itself from the objects it creates (tests/unit/deploy/test_helm.py
# checks this against its renders): not accepted in `config`.
CHART_OWNED = frozenset(
    {
        "listen",
        "http_listen",
        "metrics_listen",
        "engine",
        "sglang_urls",
        "store",
        "redis_url",
        "replicas",
        "tenants_file",
        "admin_token",
        "api_key_pepper",
    }
)
# Settings the chart cannot serve yet (docs/deployment.md "Not done yet"): files
# it does not mount, the in-process engine, and workers (one per pod: the HPA
# scales pods, and worker i's metrics port, port + i, would need a ServiceMonitor
# endpoint each).
CHART_UNSUPPORTED = frozenset(
    {
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "sglang_model_path",
        "sglang_tokenizer_path",
        "sglang_context_length",
        "sglang_mem_fraction",
        "sglang_chunked_prefill_size",
        "sglang_max_running_requests",
        "sglang_priority_scheduling",
        "sglang_engine_args",
        "workers",
    }
)
# Narrower than the server allows, for the chart's reasons.
CHART_NARROWED: dict[str, dict[str, Any]] = {
    "policy": {
        "enum": ["vtc"],
        "description": "store=redis (always, in this chart) shares the vtc policy's state only",
    }
}
_SHOWN_DEFAULTS = {"api_key_pepper": "(random per start)", "admin_token": "(none: admin API off)"}


def _default(name: str, value: Any) -> str:
    if name in _SHOWN_DEFAULTS:
        return _SHOWN_DEFAULTS[name]
    if value == "":
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def settings_table() -> str:
    """Every setting: variable, flag, default, allowed values, what it does."""
    lines = [
        "| variable | `fairgate serve` flag | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        meaning = (field.description or "").replace("|", "\\|")
        lines.append(
            f"| `{ENV_PREFIX}{name.upper()}` | `{flag}` | {_default(name, field.default)} "
            f"| {allowed(field)} | {meaning} |"
        )
    return "\n".join(lines) + "\n"


def settings_section() -> str:
    return (
        f"{HEADING}\n\n"
        "Generated from `service/settings.py` by `python -m service.settings_doc`; do not\n"
        "edit by hand. Every setting is a `FAIRGATE_<NAME>` variable and a `fairgate serve`\n"
        "flag (flags win over variables, variables over the defaults). An invalid\n"
        "configuration stops the server with one message that lists every bad setting.\n\n"
        + settings_table()
    )


def helm_config_properties() -> dict[str, Any]:
    """`config`'s properties: every setting the chart neither sets nor lacks support for."""
    schema = Settings.model_json_schema()["properties"]
    out: dict[str, Any] = {}
    for name in Settings.model_fields:
        if name in CHART_OWNED or name in CHART_UNSUPPORTED:
            continue
        prop = {k: v for k, v in schema[name].items() if k != "title"}
        prop.update(CHART_NARROWED.get(name, {}))
        out[name] = prop
    return out


def _range(bounds: tuple[float, float]) -> str:
    return f"{bounds[0]:g} – {bounds[1]:g}"


def _quota_docs() -> dict[str, str]:
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(TenantQuotas)}


def tenants_section() -> str:
    """The tenants file's fields and quotas: kind, range, meaning."""
    modes = ", ".join(OVER_QUOTA_MODES)
    kinds = {
        "id": f"text, 1–{MAX_TENANT_ID_CHARS} of letters, digits, `.`, `_`, `-`, "
        "starting with a letter or digit",
        "weight": f"a number, {_range(WEIGHT_RANGE)}",
        "priorities": "a non-empty list of " + ", ".join(PRIORITY_NAMES),
        "enabled": "true or false",
        "over_quota": f"one of {modes}",
        "quotas": "a mapping of the quotas below",
        "budgets": "a list of budgets, at most one per period (below)",
    }
    lines = [
        f"{TENANTS_HEADING}\n",
        "Generated from `scheduler/tenancy/tenants.py` and `tenant_check.py` by",
        "`python -m service.settings_doc`; do not edit by hand. The same rules hold at",
        "every entry point: the tenants file (`serve --tenants`, `admin apply`), the",
        "admin API and `fairgate admin tenants create/update`, and each lists every",
        "problem at once. Example: `deploy/tenants.example.yaml`.\n",
        "Top level: `default_tenant` (optional; one of the tenants) and `tenants`",
        "(a non-empty list). Each tenant:\n",
        "| field | allowed | meaning |",
        "|---|---|---|",
        *(f"| `{name}` | {kinds[name]} | {doc} |" for name, doc in TENANT_FIELD_DOCS.items()),
        "",
        "Quotas (each unlimited when left out or null):\n",
        "| quota | allowed | meaning |",
        "|---|---|---|",
    ]
    for name, doc in _quota_docs().items():
        kind = "an integer" if name in INTEGER_QUOTAS else "a number"
        lines.append(f"| `{name}` | {kind}, {_range(QUOTA_RANGES[name])} | {doc} |")
    t_lo, t_hi = BUDGET_TOKENS_RANGE
    r_lo, r_hi = BUDGET_REQUESTS_RANGE
    lines += [
        "",
        "Budgets (each needs `period` and at least one of `tokens`, `requests`):\n",
        "| field | allowed | meaning |",
        "|---|---|---|",
        f"| `period` | one of {', '.join(PERIODS)} | The calendar window (UTC + "
        "`budget_utc_offset_min`). |",
        f"| `tokens` | an integer, {t_lo} – {t_hi:.0e} | Tokens per window, of the kinds "
        "in `counts`. |",
        f"| `requests` | an integer, {r_lo} – {r_hi:.0e} | Requests that reached the engine "
        "per window. |",
        f"| `counts` | a list of {', '.join(TOKEN_KINDS)} | Token kinds `tokens` counts "
        "(default: all; `prompt` is the prompt tokens the engine computed). |",
        f"| `warn_at` | a number in (0, 1] | Fraction spent that raises the warning "
        f"(default {DEFAULT_WARN_AT}). |",
    ]
    return "\n".join(lines) + "\n"


def _helm_budget_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["period"],
        "anyOf": [{"required": ["tokens"]}, {"required": ["requests"]}],
        "properties": {
            "period": {"enum": list(PERIODS)},
            "tokens": {
                "type": "integer",
                "minimum": BUDGET_TOKENS_RANGE[0],
                "maximum": BUDGET_TOKENS_RANGE[1],
            },
            "requests": {
                "type": "integer",
                "minimum": BUDGET_REQUESTS_RANGE[0],
                "maximum": BUDGET_REQUESTS_RANGE[1],
            },
            "counts": {"type": "array", "minItems": 1, "items": {"enum": list(TOKEN_KINDS)}},
            "warn_at": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        },
    }


def helm_tenants_schema() -> dict[str, Any]:
    """`tenants` (the tenants file the chart seeds): the same fields and ranges."""
    quotas = {
        name: {
            "type": ["integer" if name in INTEGER_QUOTAS else "number", "null"],
            "minimum": QUOTA_RANGES[name][0],
            "maximum": QUOTA_RANGES[name][1],
            "description": doc,
        }
        for name, doc in _quota_docs().items()
    }
    tenant = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id"],
        "properties": {
            "id": {
                "type": "string",
                "maxLength": MAX_TENANT_ID_CHARS,
                "pattern": TENANT_ID_PATTERN,
            },
            "weight": {"type": "number", "minimum": WEIGHT_RANGE[0], "maximum": WEIGHT_RANGE[1]},
            "priorities": {
                "type": "array",
                "minItems": 1,
                "items": {"enum": list(PRIORITY_NAMES)},
            },
            "enabled": {"type": "boolean"},
            "over_quota": {"enum": list(OVER_QUOTA_MODES)},
            "quotas": {"type": "object", "additionalProperties": False, "properties": quotas},
            "budgets": {"type": "array", "items": _helm_budget_schema()},
        },
    }
    for name, doc in TENANT_FIELD_DOCS.items():
        tenant["properties"][name]["description"] = doc  # type: ignore[index]
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "default_tenant": {"type": "string"},
            "tenants": {"type": "array", "minItems": 1, "items": tenant},
        },
        "description": "tenants file contents (docs/configuration.md#tenants-file, "
        "deploy/tenants.example.yaml); checked again by the server at start-up",
    }


def with_section(doc: str, section: str) -> str:
    """`doc` with the section `section` heads (up to the next `## `) replaced or appended."""
    heading = section.split("\n", 1)[0]
    start = doc.find(heading + "\n")
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + section
    end = doc.find("\n## ", start + len(heading))
    rest = doc[end + 1 :] if end >= 0 else ""
    return doc[:start] + section + ("\n" + rest if rest else "")


def with_helm_config(schema_text: str) -> str:
    schema = json.loads(schema_text)
    schema["properties"]["config"]["properties"] = helm_config_properties()
    schema["properties"]["tenants"] = helm_tenants_schema()
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


_DOC_HEAD = "# Configuration\n"


def main(argv: list[str]) -> int:
    doc = DOC.read_text(encoding="utf-8") if DOC.exists() else _DOC_HEAD
    targets = {
        DOC: (doc, with_section(with_section(doc, settings_section()), tenants_section())),
        HELM_SCHEMA: (
            HELM_SCHEMA.read_text(encoding="utf-8"),
            with_helm_config(HELM_SCHEMA.read_text(encoding="utf-8")),
        ),
    }
    drifted = [path for path, (old, new) in targets.items() if old != new]
    if "--check" in argv:
        for path in drifted:
            print(f"{path.relative_to(ROOT)} is out of date: run python -m service.settings_doc")
        return 1 if drifted else 0
    for path in drifted:
        path.write_text(targets[path][1], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
