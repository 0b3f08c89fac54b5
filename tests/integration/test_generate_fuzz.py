"""No input reaches UNKNOWN or INTERNAL (issue #14): hypothesis builds GenerateRequests
and CountTokens calls from every field's extremes and sends them, with odd tenant
headers and deadlines, to a real server; each ends OK or with a client-error status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.admin.conftest import ServerThread

_ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.PERMISSION_DENIED,
}

_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_u32 = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def _sampling(draw: st.DrawFn) -> pb.SamplingParams:
    s = pb.SamplingParams(
        stop=draw(st.lists(st.text(max_size=300), max_size=18)),
        stop_token_ids=draw(st.lists(_u32, max_size=4)),
        ignore_eos=draw(st.booleans()),
    )
    for name in ("max_tokens", "top_k", "min_tokens"):
        if draw(st.booleans()):
            setattr(s, name, draw(st.one_of(_i32, st.integers(-2, 40))))
    for name in (
        "temperature",
        "top_p",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
    ):
        if draw(st.booleans()):
            setattr(s, name, draw(_f32))
    if draw(st.booleans()):
        s.seed = draw(st.integers(min_value=0, max_value=2**64 - 1))
    if not s.HasField("max_tokens") or s.max_tokens > 40:
        s.max_tokens = 8  # keep the run short; large values are still drawn above
    return s


@st.composite
def _requests(draw: st.DrawFn) -> pb.GenerateRequest:
    req = pb.GenerateRequest(
        model=draw(st.sampled_from(["", "nope", "x" * 300])),
        sampling=draw(_sampling()),
        request_id=draw(st.one_of(st.just(""), st.text(max_size=200))),
        priority=draw(st.integers(min_value=-3, max_value=7)),  # unknown enum values too
        return_token_ids=draw(st.booleans()),
    )
    if draw(st.booleans()):
        req.text = draw(st.text(max_size=200))
    else:
        req.token_ids.ids.extend(draw(st.lists(_u32, max_size=20)))
    return req


_tenants = st.one_of(
    st.just(""),
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,70}\Z"),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80),
)


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    srv = ServerThread(sim_time_scale=0.0)
    with grpc.insecure_channel(srv.address) as ch:
        yield ch
    srv.stop()


def _code(call: Any) -> grpc.StatusCode:
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


# Hypothesis runs many examples against one server; bound the whole run generously.
@pytest.mark.timeout(300)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(req=_requests(), tenant=_tenants, timeout_s=st.sampled_from([None, 1e-3, 5.0]))
def test_generate_never_unknown(
    channel: grpc.Channel, req: pb.GenerateRequest, tenant: str, timeout_s: float | None
) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    md = (("x-fairgate-tenant", tenant),) if tenant else ()
    code = _code(stub.Generate(req, metadata=md, timeout=timeout_s or 10.0))
    assert code in _ALLOWED, (code, req)
    count = pb.CountTokensRequest(model=req.model, text=req.text, return_token_ids=True)
    try:
        stub.CountTokens(count, metadata=md, timeout=10.0)
    except grpc.RpcError as exc:
        assert exc.code() in _ALLOWED, (exc.code(), count)
