from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.errors import PriorityNotAllowed, TenantDisabled, TenantRequired, UnknownTenant
from scheduler.request import Priority
from scheduler.tenancy.tenant_file import TenantConfigError, load_tenants, parse_tenants
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "tenants.example.yaml"


def test_example_file_loads_with_every_field() -> None:
    reg = load_tenants(EXAMPLE)
    assert reg.default_tenant_id == "public"
    assert [t.tenant_id for t in reg] == ["search", "nightly-eval", "public"]
    search = reg.resolve("search")
    assert search.weight == 2.0
    assert search.quotas.requests_burst == 40
    assert search.quotas.max_output_tokens_interactive == 1024
    nightly = reg.resolve("nightly-eval", Priority.BATCH)
    assert nightly.over_quota == "wait"
    assert nightly.priorities == frozenset({Priority.BATCH})
    # Every field of TenantQuotas appears in the example (it documents them all).
    text = EXAMPLE.read_text()
    for name in TenantQuotas.__dataclass_fields__:
        assert f"{name}:" in text


def test_resolve_default_unknown_disabled_and_priority() -> None:
    reg = TenantRegistry(
        [
            TenantConfig("a"),
            TenantConfig("off", enabled=False),
            TenantConfig("b", priorities=frozenset({Priority.BATCH})),
        ],
        default_tenant_id="a",
    )
    assert reg.resolve("").tenant_id == "a"
    assert reg.resolve(None).tenant_id == "a"
    with pytest.raises(UnknownTenant, match="'zz'"):
        reg.resolve("zz")
    with pytest.raises(TenantDisabled):
        reg.resolve("off")
    with pytest.raises(PriorityNotAllowed, match="interactive"):
        reg.resolve("b", Priority.INTERACTIVE)
    assert reg.resolve("b", Priority.BATCH).tenant_id == "b"


def test_no_default_tenant_refuses_anonymous_requests() -> None:
    reg = TenantRegistry([TenantConfig("a")])
    with pytest.raises(TenantRequired) as err:
        reg.resolve("")
    assert err.value.reason == "TENANT_REQUIRED"


def test_permissive_registry_admits_anyone_with_weight_one() -> None:
    reg = TenantRegistry.permissive()
    assert reg.resolve("").tenant_id == "default"
    assert reg.resolve("x").tenant_id == "x"
    assert reg.weight_of("x") == 1.0


def test_output_cap_is_lower_for_interactive() -> None:
    q = TenantQuotas(max_output_tokens=1000, max_output_tokens_interactive=100)
    assert q.output_cap_tokens(Priority.INTERACTIVE) == 100
    assert q.output_cap_tokens(Priority.BATCH) == 1000
    assert TenantQuotas().output_cap_tokens(Priority.BATCH) is None


def test_default_bursts() -> None:
    q = TenantQuotas(requests_per_s=0.2, tokens_per_min=600)
    assert q.request_burst == 1.0
    assert q.token_burst == 600


def _load(tmp_path: Path, text: str) -> TenantRegistry:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return load_tenants(path)


@pytest.mark.parametrize(
    ("body", "tenant", "field", "problem"),
    [
        ("  - id: a\n    wieght: 2\n", "a", "wieght", "unknown field"),
        ("  - id: a\n    weight: -1\n", "a", "weight", "finite number in"),
        # Issue #14: values that passed "> 0" and then broke every request.
        ("  - id: a\n    weight: 5.0e-324\n", "a", "weight", "[0.001, 1000]"),
        ("  - id: a\n    weight: .inf\n", "a", "weight", "finite"),
        ("  - id: a\n    quotas: {tokens_per_min: .inf}\n", "a", "quotas.tokens_per_min", "finite"),
        (
            "  - id: a\n    quotas: {requests_per_s: 1.0e-300}\n",
            "a",
            "quotas.requests_per_s",
            "in [",
        ),
        ("  - id: a\n    quotas: {max_queued: 10000000000000}\n", "a", "quotas.max_queued", "in ["),
        ("  - id: ../../etc/passwd\n", "../../etc/passwd", "id", "letters, digits"),
        ("  - id: " + "x" * 64 + "\n", "x" * 64, "id", "at most 63"),
        ("  - id: a\n    weight: yes\n", "a", "weight", "expected a number"),
        ("  - id: a\n    quotas: {tokens_per_min: 0}\n", "a", "quotas.tokens_per_min", "null"),
        ("  - id: a\n    quotas: {requests_per_s: 0}\n", "a", "quotas.requests_per_s", "in ["),
        ("  - id: a\n    quotas: {max_queud: 3}\n", "a", "quotas.max_queud", "unknown field"),
        ("  - id: a\n    quotas: {max_queued: 2.5}\n", "a", "quotas.max_queued", "integer"),
        ("  - id: a\n    quotas: {tokens_burst: 9}\n", "a", "quotas.tokens_burst", "needs"),
        ("  - id: a\n    over_quota: queue\n", "a", "over_quota", "reject"),
        ("  - id: a\n    priorities: [urgent]\n", "a", "priorities", "unknown class"),
        ("  - id: a\n  - id: a\n", "a", "id", "defined twice"),
        ("  - weight: 1\n", None, "tenants[0].id", "non-empty string id"),
    ],
)
def test_validation_errors_name_file_tenant_and_field(
    tmp_path: Path, body: str, tenant: str | None, field: str, problem: str
) -> None:
    with pytest.raises(TenantConfigError) as err:
        _load(tmp_path, "tenants:\n" + body)
    e = err.value
    assert e.source.endswith("tenants.yaml")
    assert e.tenant == tenant
    assert e.field == field
    assert problem in str(e)
    assert "tenants.yaml" in str(e)
    if tenant:
        assert f"tenant {tenant!r}" in str(e)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(TenantConfigError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml")
    with pytest.raises(TenantConfigError, match="not valid YAML"):
        _load(tmp_path, "tenants: [\n")
    with pytest.raises(TenantConfigError, match="non-empty list"):
        _load(tmp_path, "tenants: []\n")
    with pytest.raises(TenantConfigError, match="unknown field"):
        _load(tmp_path, "tenant:\n  - id: a\n")
    with pytest.raises(TenantConfigError, match="default_tenant"):
        _load(tmp_path, "default_tenant: b\ntenants:\n  - id: a\n")


def test_parse_tenants_from_data() -> None:
    reg = parse_tenants({"tenants": [{"id": "a", "quotas": {"max_concurrent": 2}}]})
    assert reg.resolve("a").quotas.max_concurrent == 2
    assert reg.default_tenant_id is None


def test_registry_rejects_invalid_config_objects() -> None:
    with pytest.raises(ValueError, match="weight"):
        TenantRegistry([TenantConfig("a", weight=0)])
    with pytest.raises(ValueError, match="twice"):
        TenantRegistry([TenantConfig("a"), TenantConfig("a")])
    with pytest.raises(ValueError, match="default tenant"):
        TenantRegistry([TenantConfig("a")], default_tenant_id="b")


def test_every_problem_of_a_tenants_file_at_once(tmp_path: Path) -> None:
    body = (
        "default_tenant: nobody\n"
        "extra: 1\n"
        "tenants:\n"
        "  - id: a\n    weight: 0\n    wieght: 2\n"
        "    quotas: {max_queued: abc, tokens_burst: 9, requests_per_s: 0}\n"
        "  - id: b\n    over_quota: later\n    priorities: [urgent, batch]\n    enabled: maybe\n"
        "  - id: a\n"
        "  - weight: 1\n"
        "  - 7\n"
    )
    with pytest.raises(TenantConfigError) as err:
        _load(tmp_path, body)
    got = {(p.tenant, p.field) for p in err.value.problems}
    assert got == {
        (None, "extra"),
        ("a", "wieght"),
        ("a", "weight"),
        ("a", "quotas.max_queued"),
        ("a", "quotas.tokens_burst"),
        ("a", "quotas.requests_per_s"),
        ("b", "over_quota"),
        ("b", "priorities"),
        ("b", "enabled"),
        ("a", "id"),
        (None, "tenants[3].id"),
        (None, "tenants[4]"),
        (None, "default_tenant"),
    }
    assert len(err.value.problems) == 13
    assert f"{len(got)} problems:" in str(err.value)
    assert all(line.startswith(str(tmp_path)) for line in err.value.lines())


@pytest.mark.parametrize("n", [1, 2, 5])
def test_n_bad_fields_report_n(tmp_path: Path, n: int) -> None:
    entries = "".join(f"  - id: t{i}\n    weight: -{i + 1}\n" for i in range(n))
    with pytest.raises(TenantConfigError) as err:
        _load(tmp_path, "tenants:\n" + entries + "  - id: fine\n")
    assert [(p.tenant, p.field) for p in err.value.problems] == [
        (f"t{i}", "weight") for i in range(n)
    ]
