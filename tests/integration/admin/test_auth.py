"""Security: every refused call gets the right status, and nothing reaches the queue or engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.errors import from_rpc_error
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc
from google.protobuf import field_mask_pb2

from service.app import App
from tests.conftest import StartServer
from tests.helpers import sim
from tests.integration.admin.conftest import ADMIN_TOKEN

TENANTS = """
tenants:
  - id: alpha
  - id: beta
  - id: frozen
    enabled: false
"""


async def admin_call(app: App, method: str, request: Any, token: str = ADMIN_TOKEN) -> Any:
    async with grpc.aio.insecure_channel(app.address) as ch:
        stub = apb_grpc.AdminServiceStub(ch)
        try:
            return await getattr(stub, method)(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=5
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


async def issue(app: App, tenant: str) -> apb.IssueApiKeyResponse:
    resp: apb.IssueApiKeyResponse = await admin_call(
        app, "IssueApiKey", apb.IssueApiKeyRequest(tenant_id=tenant)
    )
    return resp


@pytest.fixture
async def keyed(start_server: StartServer, tmp_path: Path) -> App:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return await start_server(tenants_file=str(path), admin_token=ADMIN_TOKEN)


def _engine_untouched(app: App) -> tuple[int, int]:
    model = app.models.resolve("")
    assert model is not None
    return sim(app).stats.started, model.dispatcher.admitted_total


async def _refused(app: App, code: grpc.StatusCode, **client_kwargs: Any) -> FairgateError:
    before = _engine_untouched(app)
    async with AsyncClient(app.address, **client_kwargs) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete("must not run", max_tokens=2)
    assert err.value.code == code, err.value
    assert _engine_untouched(app) == before, "a refused request reached the queue or engine"
    return err.value


async def test_keys_map_to_their_tenant_and_refusals_admit_nothing(keyed: App) -> None:
    alpha = await issue(keyed, "alpha")
    beta = await issue(keyed, "beta")
    async with AsyncClient(keyed.address, api_key=alpha.secret) as c:
        assert (await c.complete("hi", max_tokens=2)).result.finish_reason == "length"
        # ListModels and CountTokens need the key too, and accept it.
        assert await c.list_models()
    model = keyed.models.resolve("")
    assert model is not None and model.dispatcher.stats().tenant("alpha") is not None

    err = await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED)  # no key
    assert err.reason == "API_KEY_REQUIRED" and "Bearer" in err.message
    forged = alpha.secret[:-4] + ("AAAA" if not alpha.secret.endswith("AAAA") else "BBBB")
    err = await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, api_key=forged)  # wrong key
    assert err.reason == "API_KEY_INVALID"
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, api_key="not-a-key")
    # Another tenant's id beside a valid key: the header never overrides the key.
    err = await _refused(
        keyed, grpc.StatusCode.PERMISSION_DENIED, api_key=alpha.secret, tenant="beta"
    )
    assert err.reason == "TENANT_MISMATCH" and "'beta'" in err.message
    # Naming one's own tenant is fine.
    async with AsyncClient(keyed.address, api_key=beta.secret, tenant="beta") as c:
        await c.complete("ok", max_tokens=1)
    # Without a key, the header alone is not accepted once keys exist.
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, tenant="alpha")
    # Other RPCs of the inference API are guarded too.
    async with AsyncClient(keyed.address) as c:
        with pytest.raises(FairgateError) as e:
            await c.count_tokens("x")
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED

    # Revoked: refused at once (and it stays refused: revoking all keys does not reopen).
    await admin_call(keyed, "RevokeApiKey", apb.RevokeApiKeyRequest(key_id=alpha.key.key_id))
    await admin_call(keyed, "RevokeApiKey", apb.RevokeApiKeyRequest(key_id=beta.key.key_id))
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, api_key=alpha.secret)
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED)


async def test_disabled_tenants_and_live_changes(keyed: App) -> None:
    frozen = await issue(keyed, "frozen")
    err = await _refused(keyed, grpc.StatusCode.PERMISSION_DENIED, api_key=frozen.secret)
    assert err.reason == "TENANT_DISABLED"
    alpha = await issue(keyed, "alpha")
    async with AsyncClient(keyed.address, api_key=alpha.secret) as c:
        await c.complete("before", max_tokens=1)
    # Disable alpha through the admin API: refused on the very next request.
    await admin_call(
        keyed,
        "UpdateTenant",
        apb.UpdateTenantRequest(
            tenant=apb.Tenant(id="alpha", enabled=False),
            update_mask=field_mask_pb2.FieldMask(paths=["enabled"]),
        ),
    )
    await _refused(keyed, grpc.StatusCode.PERMISSION_DENIED, api_key=alpha.secret)
    # Deleting a tenant deletes its keys.
    await admin_call(keyed, "DeleteTenant", apb.DeleteTenantRequest(tenant_id="alpha"))
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, api_key=alpha.secret)


async def test_admin_api_credentials(keyed: App, start_server: StartServer) -> None:
    alpha = await issue(keyed, "alpha")
    with pytest.raises(FairgateError) as err:
        await admin_call(keyed, "ListTenants", apb.ListTenantsRequest(), token=alpha.secret)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.reason == "ADMIN_REQUIRED"
    with pytest.raises(FairgateError) as err:
        await admin_call(keyed, "ListTenants", apb.ListTenantsRequest(), token="guess")
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    # A tenant key cannot issue itself more keys either.
    with pytest.raises(FairgateError) as err:
        await admin_call(
            keyed, "IssueApiKey", apb.IssueApiKeyRequest(tenant_id="beta"), token=alpha.secret
        )
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    # No admin token configured: the admin API is off.
    bare = await start_server()
    with pytest.raises(FairgateError) as err:
        await admin_call(bare, "ListTenants", apb.ListTenantsRequest())
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "FAIRGATE_ADMIN_TOKEN" in err.value.message


async def test_auth_modes(start_server: StartServer) -> None:
    # Zero config (the quick start): open, default tenant; the header names a tenant.
    open_app = await start_server(admin_token=ADMIN_TOKEN)
    async with AsyncClient(open_app.address) as c:
        await c.complete("quick start", max_tokens=1)
    # api-key mode refuses keyless requests even before any key exists.
    strict = await start_server(auth_mode="api-key")
    await _refused(strict, grpc.StatusCode.UNAUTHENTICATED)
    # dev-header mode: the header is accepted without a key even once keys exist.
    dev = await start_server(auth_mode="dev-header", admin_token=ADMIN_TOKEN)
    await admin_call(dev, "CreateTenant", apb.CreateTenantRequest(tenant=apb.Tenant(id="t1")))
    key = await issue(dev, "t1")
    async with AsyncClient(dev.address, tenant="t1") as c:
        await c.complete("dev", max_tokens=1)
    # ... but a key still wins over the header.
    await _refused(dev, grpc.StatusCode.PERMISSION_DENIED, api_key=key.secret, tenant="t2")


async def test_rotation_grace_period(keyed: App) -> None:
    old = await issue(keyed, "alpha")
    rotated: apb.RotateApiKeyResponse = await admin_call(
        keyed, "RotateApiKey", apb.RotateApiKeyRequest(key_id=old.key.key_id, grace_period_s=60)
    )
    for secret in (old.secret, rotated.secret):
        async with AsyncClient(keyed.address, api_key=secret) as c:
            await c.complete("both work during the grace period", max_tokens=1)
    assert rotated.retired.HasField("expire_time") and rotated.key.tenant_id == "alpha"
    with pytest.raises(FairgateError) as err:
        await admin_call(
            keyed, "RotateApiKey", apb.RotateApiKeyRequest(key_id="0" * 16, grace_period_s=-1)
        )
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.field_violations[0][0] == "grace_period_s"


BAD_HEADER_IDS = ["x" * 1000, "../../etc/passwd", "a b", "-leading-dash", "semi;colon"]


@pytest.mark.parametrize("mode", ["auto", "dev-header"])
async def test_header_tenant_ids_follow_the_admin_id_rule(
    start_server: StartServer, mode: str
) -> None:
    """Issue #14: open/dev-header modes took any header value as a tenant id (1 000
    chars, `../../etc/passwd`) and grew per-tenant state for each one."""
    app = await start_server(auth_mode=mode)
    model = app.models.resolve("")
    assert model is not None
    async with AsyncClient(app.address, tenant="team-ok.1") as c:
        await c.complete("a valid id is served", max_tokens=1)
    seen_before = set(model.dispatcher.quotas.tenants_seen())
    for bad in BAD_HEADER_IDS:
        err = await _refused(app, grpc.StatusCode.INVALID_ARGUMENT, tenant=bad)
        assert [f for f, _ in err.field_violations] == ["metadata.x-fairgate-tenant"]
        # The refusal names the rule and never echoes a huge value back.
        assert "letters, digits" in str(err) or "at most 63" in str(err)
        assert len(str(err)) < 400
    assert set(model.dispatcher.quotas.tenants_seen()) == seen_before


async def test_keys_are_checked_before_the_header(keyed: App) -> None:
    await issue(keyed, "alpha")
    # No key where keys are required: UNAUTHENTICATED, whatever the header says.
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, tenant="x" * 1000)
    # A bad key: UNAUTHENTICATED; a good key with a malformed header: INVALID_ARGUMENT.
    await _refused(keyed, grpc.StatusCode.UNAUTHENTICATED, api_key="fg_nope", tenant="../x")
    key = await issue(keyed, "alpha")
    await _refused(keyed, grpc.StatusCode.INVALID_ARGUMENT, api_key=key.secret, tenant="../x")
