"""Fixtures and checks for tests against the SGLang stand-in on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from service.app import App
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.simulator.sim_server import SimServer
from tests.helpers import eventually

StartSim = Callable[..., Awaitable[SimServer]]


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    """Start SGLang stand-ins on 127.0.0.1; all are stopped at teardown."""
    servers: list[SimServer] = []

    async def _start(
        *,
        time_scale: float = 0.0,
        incremental_output: bool = False,
        enable_priority_scheduling: bool = False,
        **config: Any,
    ) -> SimServer:
        config.setdefault("priority_scheduling", enable_priority_scheduling)
        sim_config = SimConfig(cost=preset(), **config)
        server = SimServer(
            SimulatedEngine(sim_config, time_scale=time_scale),
            incremental_output=incremental_output,
            enable_priority_scheduling=enable_priority_scheduling,
        )
        await server.start()
        servers.append(server)
        return server

    yield _start
    for s in servers:
        await s.stop()


def sent_lengths(worker: SimServer) -> list[tuple[int, int]]:
    """(prompt tokens, max_new_tokens) of each /generate the stand-in received."""
    out = []
    for body in worker.record.requests:
        params: dict[str, Any] = body.get("sampling_params", {})
        out.append((len(body.get("input_ids") or []), int(params.get("max_new_tokens", -1))))
    return out


def sglang_settings(*servers: SimServer, **overrides: Any) -> dict[str, Any]:
    return {
        "engine": "sglang-http",
        "sglang_urls": ",".join(s.url for s in servers),
        "capacity_refresh_s": 0.1,
        **overrides,
    }


async def assert_no_sglang_leaks(app: App, *servers: SimServer) -> None:
    """Gateway drained, adapter holds no stream, live stand-ins hold no request."""
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    engine: Any = app.engine
    await eventually(
        lambda: (
            d.queued == 0
            and d.in_flight == 0
            and engine.in_flight == 0
            and all(s.engine.active_requests == 0 for s in servers)
        ),
        what="gateway, adapter and stand-ins to drain",
    )
    assert d.budget.engine.kv_tokens == 0
    assert all(s.engine.core.used_kv == 0 for s in servers)
