"""Redis killed and restarted under load: the failure policy, no stream dropped, no leak."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import grpc
import pytest
from fairgate import AsyncClient, FairgateError

from scheduler.dispatcher import Dispatcher
from scheduler.shared.admission import SharedAdmission, SharedDispatcher
from scheduler.state.redis_store import RedisStore
from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually
from tests.redis_server import RedisServer, find_redis_server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    binary = find_redis_server()
    assert binary is not None
    srv = RedisServer(binary)
    srv.start()
    yield srv
    srv.stop()


def shared(app: App) -> SharedDispatcher:
    model = app.models.resolve("")
    assert model is not None and isinstance(model.dispatcher, Dispatcher)
    assert isinstance(model.dispatcher.state, SharedAdmission)
    return model.dispatcher


async def _stream(c: AsyncClient, i: int) -> str:
    """Finish reason, or the status code name if refused."""
    try:
        comp = await c.complete([17] * 8, max_tokens=120)
    except FairgateError as exc:
        return exc.code.name
    assert comp.result.usage.completion_tokens == 120  # never cut short
    return comp.result.finish_reason


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_redis_killed_and_restarted_under_load(
    start_server: StartServer,
    own_redis: RedisServer,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler.shared.dispatcher")
    app = await start_server(
        store="redis",
        redis_url=own_redis.url,
        redis_failure_mode=mode,
        redis_retry_s=0.1,
        redis_timeout_s=0.3,
        replicas=2,
        sim_time_scale=1.0,
        sim_max_running_requests=4,
    )
    d = shared(app)
    async with AsyncClient(app.address, tenant="t") as c:
        first = [asyncio.create_task(_stream(c, i)) for i in range(8)]
        await eventually(lambda: d.in_flight == 4 and d.queued == 4, what="4 running, 4 queued")
        own_redis.kill()
        await eventually(lambda: d.state.health.mode == mode, what=f"failing {mode}")
        during = [asyncio.create_task(_stream(c, i)) for i in range(2)]
        results = await asyncio.gather(*first)
        results_during = await asyncio.gather(*during)
        # In flight when Redis died: all four finished in full (`_stream` checks the length).
        if mode == "open":
            # Queued and new requests went on, within this replica's half of the engine.
            assert results == ["length"] * 8 and results_during == ["length"] * 2
        else:
            # The four queued ones were refused; the four in flight finished.
            assert sorted(results) == ["UNAVAILABLE"] * 4 + ["length"] * 4
            assert results_during == ["UNAVAILABLE"] * 2
            with pytest.raises(FairgateError) as err:
                await c.complete("x", max_tokens=2)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert err.value.retry_after_s is not None
        # Streams in flight when Redis comes back are adopted, then settled.
        late = [asyncio.create_task(_stream(c, i)) for i in range(2)] if mode == "open" else []
        await eventually(lambda: d.in_flight == len(late), what="the late streams run")
        own_redis.start()  # empty: the state was lost with the process
        await eventually(lambda: d.state.health.mode == "ok", timeout_s=5, what="reconciled")
        assert all(r == "length" for r in await asyncio.gather(*late))
        after = await asyncio.gather(*(_stream(c, i) for i in range(3)))
        assert after == ["length"] * 3
    assert d.state.health.transitions_total == 2
    await assert_no_leaks(app)
    assert d.state.quotas.open_reservations == 0
    store = RedisStore.from_url(own_redis.url, domain=app.models.default)

    async def nothing_held() -> bool:
        """The last settlements have reached Redis (a step carries them)."""
        snap = await store.snapshot()
        return snap.in_flight == 0 and snap.leases == set() and snap.concurrency == {}

    try:
        await eventually(nothing_held, what="the store holds nothing")
    finally:
        await store.aclose()
    assert d.state.pending_settlements == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"failing {mode}" in m for m in messages)
    assert any("shared store back" in m for m in messages)
