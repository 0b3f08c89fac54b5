"""Graceful shutdown on the OpenAI HTTP port: the same drain as gRPC
(service/drain.py, applied in service/generation.py), driven by the `openai` SDK."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import openai
import pytest
from fairgate import AsyncClient, FairgateError

from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually


def _client(app: App) -> openai.AsyncOpenAI:
    assert app.http is not None
    return openai.AsyncOpenAI(base_url=app.http.url, api_key="unused", max_retries=0)


def _assert_draining(exc: openai.APIStatusError) -> None:
    assert exc.status_code == 503
    body = exc.body
    assert isinstance(body, dict) and body["code"] == "server_shutting_down"
    assert int(exc.response.headers["retry-after"]) >= 1
    assert int(exc.response.headers["retry-after-ms"]) >= 1


async def test_http_queued_and_new_requests_fail_at_once_and_cut_streams_end(
    start_server: StartServer,
) -> None:
    app = await start_server(
        http_listen="127.0.0.1:0", sim_time_scale=1.0, sim_max_running_requests=1
    )
    assert app.http is not None
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    health = app.http.url.removesuffix("/v1") + "/health"
    async with _client(app) as oai, aiohttp.ClientSession() as http:
        async with http.get(health) as r:
            assert r.status == 200
        running = await oai.completions.create(
            model=app.models.default, prompt="holds the only slot", max_tokens=5000, stream=True
        )
        chunks = aiter(running)
        assert (await anext(chunks)).choices[0].text
        queued = asyncio.create_task(
            oai.completions.create(model=app.models.default, prompt="waits", max_tokens=2)
        )
        await eventually(lambda: d.queued == 1, what="a queued HTTP request")
        stop = asyncio.create_task(app.stop(grace_s=60))
        # The queued request fails while the drain goes on (the stream holds it open).
        with pytest.raises(openai.APIStatusError) as err:
            await queued
        _assert_draining(err.value)
        assert not stop.done() and d.in_flight == 1 and d.queued == 0
        # The port still listens: /health says 503, new requests get 503 on both fronts.
        async with http.get(health) as r:
            assert r.status == 503
        with pytest.raises(openai.APIStatusError) as err:
            await oai.completions.create(model=app.models.default, prompt="late", max_tokens=2)
        _assert_draining(err.value)
        async with AsyncClient(app.address) as grpc_client:
            with pytest.raises(FairgateError) as grpc_err:
                await grpc_client.complete("late too", max_tokens=2, timeout_s=5)
        assert grpc_err.value.code == grpc.StatusCode.UNAVAILABLE
        # Cut short: the running stream is aborted in the engine and still ends properly.
        app.drain.cut_short()
        rest = [c async for c in chunks]
        await stop
    finishes = [c.choices[0].finish_reason for c in rest if c.choices]
    assert finishes[-1] == "abort"
    await assert_no_leaks(app)
