"""The operators' table and the Helm values schema follow the settings' declaration."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from scheduler.tenancy.tenant_file import TenantConfigError, parse_tenants
from scheduler.tenancy.tenants import QUOTA_RANGES, WEIGHT_RANGE
from service import settings_doc
from service.settings import Settings


def test_the_configuration_page_lists_every_setting_as_declared() -> None:
    doc = settings_doc.DOC.read_text(encoding="utf-8")
    assert settings_doc.with_section(doc, settings_doc.settings_section()) == doc, (
        "docs/configuration.md drifted from service/settings.py: run python -m service.settings_doc"
    )
    for name, field in Settings.model_fields.items():
        row = next(
            line for line in doc.splitlines() if line.startswith(f"| `FAIRGATE_{name.upper()}` |")
        )
        assert f"`--{name.replace('_', '-')}`" in row and (field.description or "") in row


def test_the_helm_config_schema_is_the_declarations() -> None:
    text = settings_doc.HELM_SCHEMA.read_text(encoding="utf-8")
    assert settings_doc.with_helm_config(text) == text, (
        "values.schema.json drifted from service/settings.py: run python -m service.settings_doc"
    )
    config = json.loads(text)["properties"]["config"]["properties"]
    # Bounds as declared, e.g. kv_target_fraction in (0, 1].
    assert config["kv_target_fraction"]["exclusiveMinimum"] == 0
    assert config["kv_target_fraction"]["maximum"] == 1
    assert config["log_level"]["enum"] == ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def test_the_section_is_replaced_in_place_and_the_rest_kept() -> None:
    doc = "# T\n\nintro\n\n## Settings\n\nold table\n\n## Later\n\nkept\n"
    new = settings_doc.with_section(doc, "## Settings\n\nnew\n")
    assert new == "# T\n\nintro\n\n## Settings\n\nnew\n\n## Later\n\nkept\n"
    assert (
        settings_doc.with_section("# T\n", "## Settings\n\nnew\n") == "# T\n\n## Settings\n\nnew\n"
    )


def test_check_mode_fails_on_drift(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "configuration.md"
    doc.write_text("# Configuration\n\n## Settings\n\nstale\n", encoding="utf-8")
    monkeypatch.setattr(settings_doc, "DOC", doc)
    monkeypatch.setattr(settings_doc, "ROOT", tmp_path.parent)
    schema = tmp_path / "values.schema.json"
    schema.write_text(settings_doc.HELM_SCHEMA.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(settings_doc, "HELM_SCHEMA", schema)
    assert settings_doc.main(["--check"]) == 1
    assert settings_doc.main([]) == 0
    assert settings_doc.main(["--check"]) == 0
    assert "FAIRGATE_WORKERS" in doc.read_text(encoding="utf-8")


def test_the_tenants_section_and_helm_schema_follow_the_declaration() -> None:
    doc = settings_doc.DOC.read_text(encoding="utf-8")
    assert settings_doc.with_section(doc, settings_doc.tenants_section()) == doc
    schema = json.loads(settings_doc.HELM_SCHEMA.read_text(encoding="utf-8"))
    assert schema["properties"]["tenants"] == settings_doc.helm_tenants_schema()
    tenant = schema["properties"]["tenants"]["properties"]["tenants"]["items"]
    assert set(tenant["properties"]["quotas"]["properties"]) == set(QUOTA_RANGES)


def test_the_chart_schema_and_the_loader_agree_on_tenants_files() -> None:
    """The chart's values schema accepts the example and refuses what the
    loader refuses, field for field."""
    validator = jsonschema.Draft7Validator(settings_doc.helm_tenants_schema())
    example = yaml.safe_load((settings_doc.ROOT / "deploy" / "tenants.example.yaml").read_text())
    assert list(validator.iter_errors(example)) == []
    load = parse_tenants(example)
    assert len(load) == len(example["tenants"])
    bad = {
        "tenants": [
            {"id": "a", "weight": 0, "quotas": {"max_queued": 2.5, "tokens_per_min": 0}},
            {"id": "b/c", "over_quota": "later", "wieght": 1},
        ]
    }
    schema_paths = {
        "/".join(str(p) for p in e.absolute_path) or e.message for e in validator.iter_errors(bad)
    }
    with pytest.raises(TenantConfigError) as err:
        parse_tenants(bad)
    assert len(err.value.problems) == len(schema_paths) == 6, schema_paths


def test_range_tables_in_the_docs_match_the_declaration() -> None:
    """A hand-written `| field | range |` table (README) states the declared ranges."""
    ranges = {"weight": WEIGHT_RANGE, **QUOTA_RANGES}
    row = re.compile(r"^\| ((?:`\w+`(?:, )?)+) \| ([\d.e+]+) – ([\d .e+]+) \|$")
    seen = set()
    for page in [settings_doc.ROOT / "README.md", *(settings_doc.ROOT / "docs").glob("*.md")]:
        for line in page.read_text(encoding="utf-8").splitlines():
            found = row.match(line)
            if not found:
                continue
            lo, hi = (float(x.replace(" ", "")) for x in found.group(2, 3))
            for name in re.findall(r"`(\w+)`", found.group(1)):
                assert ranges[name] == (lo, hi), (page.name, name)
                seen.add(name)
    assert seen == set(ranges)
