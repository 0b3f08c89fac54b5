"""Undecodable protobuf over a real grpc.aio channel: authentication first, then
INVALID_ARGUMENT with a BadRequest, and one log line per interval (issue #14)."""

from __future__ import annotations

import logging

import grpc
import pytest
from fairgate import AsyncClient
from fairgate.errors import from_rpc_error

from service.app import App
from service.decode_guard import ThrottledLog
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, sim
from tests.integration.admin.conftest import ADMIN_TOKEN

GARBAGE = [b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05ab"]
INFERENCE = "/fairgate.v1.InferenceService/"
UNARY = [
    INFERENCE + "CountTokens",
    INFERENCE + "ListModels",
    "/fairgate.v1.AdminService/ListTenants",
    "/fairgate.v1.AdminService/CreateTenant",
    "/grpc.health.v1.Health/Check",
]


async def _call(
    app: App, method: str, raw: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.RpcError:
    async with grpc.aio.insecure_channel(app.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            if method.endswith("/Generate"):
                async for _ in ch.unary_stream(method)(raw, metadata=metadata, timeout=5):
                    pass
            else:
                await ch.unary_unary(method)(raw, metadata=metadata, timeout=5)
    return err.value


@pytest.mark.parametrize("method", [INFERENCE + "Generate", *UNARY])
async def test_undecodable_request_is_invalid_argument(
    start_server: StartServer, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = await start_server(admin_token=ADMIN_TOKEN)
    md = (("authorization", f"Bearer {ADMIN_TOKEN}"),) if "AdminService" in method else ()
    caplog.set_level(logging.INFO)
    for _ in range(40):
        for raw in GARBAGE:
            exc = await _call(app, method, raw, md)
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
            err = from_rpc_error(exc)
            assert [f for f, _ in err.field_violations] == ["request"]
    # One warning for 120 refusals, and no traceback.
    warnings = [r for r in caplog.records if r.name == "service.decode_guard"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    # Nothing reached the engine or the queue; the server still serves.
    assert sim(app).stats.started == 0
    await assert_no_leaks(app)
    async with AsyncClient(app.address) as c:
        assert (await c.complete("still fine", max_tokens=2)).result.finish_reason == "length"


async def test_authentication_comes_before_decoding(start_server: StartServer) -> None:
    app = await start_server(auth_mode="api-key", admin_token=ADMIN_TOKEN)
    for method in (INFERENCE + "Generate", INFERENCE + "CountTokens"):
        exc = await _call(app, method, GARBAGE[0])
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
    exc = await _call(app, "/fairgate.v1.AdminService/ListTenants", GARBAGE[0])
    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
    bad_admin = (("authorization", "Bearer wrong"),)
    exc = await _call(app, "/fairgate.v1.AdminService/ListTenants", GARBAGE[0], bad_admin)
    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED


def test_throttled_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    t = ThrottledLog(60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="service.decode_guard")
    for _ in range(5):
        t.warn("bad %s", "x")
    now[0] = 61.0
    t.warn("bad %s", "y")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["bad x", "bad y (and 4 more in the last 60s)"]


async def test_undecodable_message_on_the_reflection_stream_is_invalid_argument(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The one client-streaming method: a good message is answered, then a bad
    # one ends the stream with INVALID_ARGUMENT (not UNKNOWN and a traceback).
    from grpc_reflection.v1alpha import reflection_pb2

    app = await start_server()
    method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    good = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    caplog.set_level(logging.INFO)
    async with grpc.aio.insecure_channel(app.address) as ch:
        for raw in GARBAGE:
            call = ch.stream_stream(method)(iter([good, raw]), timeout=5)
            first = reflection_pb2.ServerReflectionResponse.FromString(await call.read())
            names = {s.name for s in first.list_services_response.service}
            assert "fairgate.v1.InferenceService" in names
            with pytest.raises(grpc.RpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert [f for f, _ in from_rpc_error(err.value).field_violations] == ["request"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    await assert_no_leaks(app)
