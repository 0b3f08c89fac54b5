"""The operators' settings table and the Helm chart's `config` schema, generated
from the declaration in service/settings.py.

    python -m service.settings_doc           # rewrite both
    python -m service.settings_doc --check   # exit 1 when either drifted (CI)

The table is the `## Settings` section of docs/configuration.md (the rest of
the page is prose, left alone); the schema is `properties.config.properties`
of deploy/helm/fairgate/values.schema.json. tests/unit/service/test_settings_doc.py
fails when either differs from what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from service.settings import ENV_PREFIX, Settings
from service.settings_errors import allowed

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
HELM_SCHEMA = ROOT / "deploy" / "helm" / "fairgate" / "values.schema.json"
HEADING = "## Settings"

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
# Settings the chart cannot serve yet: files it does not mount, the in-process
# engine, and workers (one per pod: the HPA scales pods, and worker i's metrics
# port, port + i, would need a ServiceMonitor endpoint each).
CHART_UNSUPPORTED = frozenset(
    {
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "sglang_model_path",
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


def with_section(doc: str, section: str) -> str:
    """`doc` with its `## Settings` section (up to the next `## `) replaced or appended."""
    start = doc.find(HEADING + "\n")
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + section
    end = doc.find("\n## ", start + len(HEADING))
    rest = doc[end + 1 :] if end >= 0 else ""
    return doc[:start] + section + ("\n" + rest if rest else "")


def with_helm_config(schema_text: str) -> str:
    schema = json.loads(schema_text)
    schema["properties"]["config"]["properties"] = helm_config_properties()
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


_DOC_HEAD = "# Configuration\n"


def main(argv: list[str]) -> int:
    doc = DOC.read_text(encoding="utf-8") if DOC.exists() else _DOC_HEAD
    targets = {
        DOC: (doc, with_section(doc, settings_section())),
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
