"""Every weight and quota is checked against one finite range at every entry point.

Issue #14: `tokens_per_min=inf`, `requests_per_s=1e-300` and `weight=5e-324`
passed validation and then broke every request with UNKNOWN. Here hypothesis
throws extreme values at the tenants file, the admin API and the CLI of a real
server; each value is either refused with a clear error naming the field, or
accepted and then served without UNKNOWN/INTERNAL (for that tenant and others).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.tenancy.tenant_file import TenantConfigError, parse_tenants
from scheduler.tenancy.tenants import INTEGER_QUOTAS, QUOTA_RANGES
from tests.integration.admin.conftest import ADMIN_TOKEN, Cli, ServerThread

_INT_QUOTAS = INTEGER_QUOTAS
_ADMIN_MD = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
# Codes a well-formed request may end with; never UNKNOWN or INTERNAL.
_SERVED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INVALID_ARGUMENT,
}

_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, 5e-324, 1e-300, 1e-3, 0.5, 1.0, 7.0, 1e6, 1e12, 1e300]),
)
_ints = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 3, 2**31, 2**53 + 1, 2**63 - 1]),
)


@st.composite
def _tenants(draw: st.DrawFn) -> dict[str, Any]:
    quotas = {
        name: draw(_ints if name in _INT_QUOTAS else _floats)
        for name in QUOTA_RANGES
        if draw(st.booleans())
    }
    raw: dict[str, Any] = {"quotas": quotas}
    if draw(st.booleans()):
        raw["weight"] = draw(_floats)
    raw["over_quota"] = draw(st.sampled_from(["reject", "wait"]))
    return raw


def _proto(tenant_id: str, raw: dict[str, Any]) -> apb.Tenant:
    t = apb.Tenant(id=tenant_id, over_quota=apb.OVER_QUOTA_MODE_WAIT)
    if raw["over_quota"] == "reject":
        t.over_quota = apb.OVER_QUOTA_MODE_REJECT
    if "weight" in raw:
        t.weight = raw["weight"]
    for name, value in raw["quotas"].items():
        setattr(t.quotas, name, value)
    return t


@pytest.fixture(scope="module")
def served() -> Iterator[ServerThread]:
    srv = ServerThread(sim_time_scale=0.0)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def channel(served: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.address) as ch:
        admin = apb_grpc.AdminServiceStub(ch)
        neighbour = apb.CreateTenantRequest(tenant=apb.Tenant(id="neighbour"))
        admin.CreateTenant(neighbour, metadata=_ADMIN_MD, timeout=5)
        yield ch


def _generate(channel: grpc.Channel, tenant_id: str) -> grpc.StatusCode:
    stub = pb_grpc.InferenceServiceStub(channel)
    req = pb.GenerateRequest(text="hello there", sampling=pb.SamplingParams(max_tokens=4))
    try:
        for _ in stub.Generate(req, metadata=(("x-fairgate-tenant", tenant_id),), timeout=2.0):
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


_counter = iter(range(10**9))


# Hypothesis runs many examples against one server; bound the whole run generously.
@pytest.mark.timeout(300)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=_tenants())
@example(raw={"quotas": {"tokens_per_min": math.inf}, "over_quota": "reject"})
@example(raw={"quotas": {"requests_per_s": 1e-300}, "over_quota": "reject"})
@example(raw={"quotas": {"requests_per_s": 1e-300}, "over_quota": "wait"})
@example(raw={"quotas": {}, "weight": 5e-324, "over_quota": "reject"})
@example(raw={"quotas": {"max_queue_wait_s": 1e300}, "over_quota": "wait"})
@example(raw={"quotas": {"requests_per_s": 1e-6, "tokens_per_min": 1.0}, "over_quota": "reject"})
@example(raw={"quotas": {"requests_per_s": 1e-6, "tokens_per_min": 1.0}, "over_quota": "wait"})
@example(raw={"quotas": {}, "weight": 1e-3, "over_quota": "reject"})
def test_config_paths_never_unknown(channel: grpc.Channel, raw: dict[str, Any]) -> None:
    tenant_id = f"h{next(_counter)}"
    admin = apb_grpc.AdminServiceStub(channel)
    # The tenants file and the admin API apply the same rule.
    try:
        parse_tenants({"tenants": [{"id": tenant_id, **raw}]}, "<hypothesis>")
        file_ok = True
    except TenantConfigError as exc:
        file_ok = False
        assert exc.field is not None
    try:
        admin.CreateTenant(
            apb.CreateTenantRequest(tenant=_proto(tenant_id, raw)), metadata=_ADMIN_MD, timeout=5
        )
        admin_ok = True
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        admin_ok = False
    assert admin_ok == file_ok, raw
    if not admin_ok:
        return
    # Accepted: this tenant and a neighbour are served without UNKNOWN.
    assert _generate(channel, tenant_id) in _SERVED
    assert _generate(channel, "neighbour") == grpc.StatusCode.OK


@pytest.mark.parametrize(
    "flags",
    [
        ["--weight", "5e-324"],
        ["--weight", "inf"],
        ["-q", "tokens_per_min=inf"],
        ["-q", "requests_per_s=1e-300"],
        ["-q", "max_queue_wait_s=nan"],
    ],
)
def test_cli_refuses_out_of_range_values(served: ServerThread, flags: list[str]) -> None:
    cli = Cli(served.address)
    r = cli("admin", "tenants", "create", f"c{next(_counter)}", *flags)
    assert r.exit_code != 0
    assert "INVALID_ARGUMENT" in r.output or "finite number in" in r.output, r.output
    assert "Traceback" not in r.output
