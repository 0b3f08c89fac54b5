"""The server on uvloop (setting event_loop): the whole service, both fronts and
the SGLang HTTP adapter, runs and streams on it; the choice is validated. The
stand-in worker runs in a child process on its own (asyncio) loop."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from fairgate import AsyncClient
from fairgate.bench.common import child_server

from service import event_loop
from service.app import App
from service.settings import Settings
from service.telemetry.telemetry import Telemetry

uvloop = pytest.importorskip("uvloop")


def test_auto_takes_uvloop_when_installed() -> None:
    assert event_loop.loop_factory("auto") is uvloop.new_event_loop
    assert event_loop.loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop.loop_factory("asyncio") is None
    with pytest.raises(ValueError, match="unknown event_loop"):
        event_loop.loop_factory("tokio")
    with pytest.raises(
        ValueError, match=r"FAIRGATE_EVENT_LOOP\): expected one of auto, uvloop, asyncio"
    ):
        Settings.from_env({}, event_loop="tokio")


async def _serve_and_stream() -> tuple[str, int, str, str]:
    async with child_server(
        "service.engines.simulator.http_server", "--announce", "--port=0", "--time-scale=0"
    ) as stand_in:
        return await _through(f"http://{stand_in.address}")


async def _through(worker_url: str) -> tuple[str, int, str, str]:
    settings = Settings(listen="127.0.0.1:0", shutdown_grace_s=1.0).replace(
        engine="sglang-http", sglang_urls=worker_url, http_listen="127.0.0.1:0"
    )
    app = await App.start(settings, Telemetry.disabled())
    try:
        async with AsyncClient(app.address) as c:
            got = await c.complete("on uvloop", max_tokens=20, ignore_eos=True)
        assert app.http is not None
        body = {"prompt": "on uvloop", "max_tokens": 5, "ignore_eos": True}
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{app.http.url}/completions", json=body) as r,
        ):
            answer = await r.json()
            assert r.status == 200, answer
        loop_type = type(asyncio.get_running_loop()).__module__
        return (
            loop_type,
            got.result.usage.completion_tokens,
            got.result.finish_reason,
            str(answer["choices"][0]["finish_reason"]),
        )
    finally:
        await app.stop(grace_s=0.5)


def test_the_service_streams_on_uvloop() -> None:
    loop_module, tokens, finish, http_finish = event_loop.run(_serve_and_stream(), "uvloop")
    assert loop_module.startswith("uvloop")
    assert (tokens, finish, http_finish) == (20, "length", "length")
