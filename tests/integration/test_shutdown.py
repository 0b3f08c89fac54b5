"""Graceful shutdown (issue #14): cut streams end with a final CANCELLED result,
queued requests fail at once with UNAVAILABLE + RetryInfo, and health answers
NOT_SERVING on new connections while the server drains."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import grpc
import pytest
from fairgate import AsyncClient, Delta, FairgateError, Result
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.app import App
from service.grpc_server import SERVICE_NAME
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, eventually

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _dispatcher(app: App):  # type: ignore[no-untyped-def]
    model = app.models.resolve("")
    assert model is not None
    return model.dispatcher


async def _health_on_new_connection(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return int(resp.status)


async def test_streams_cut_at_the_end_of_the_drain_get_a_final_result(
    start_server: StartServer,
) -> None:
    app = await start_server(sim_time_scale=1.0)
    async with AsyncClient(app.address) as c:
        stream = c.generate("a long answer", max_tokens=5000)
        assert isinstance(await stream.__anext__(), Delta)
        await app.stop(grace_s=0.2)
        events = [ev async for ev in stream]  # no error: the status is OK
    result = events[-1]
    assert isinstance(result, Result)
    assert result.finish_reason == "cancelled"
    assert "shutting down" in result.message
    assert 0 < result.usage.completion_tokens < 5000
    await assert_no_leaks(app)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_queued_requests_fail_at_once_and_health_is_not_serving(
    start_server: StartServer, request: pytest.FixtureRequest, store: str
) -> None:
    extra = {"store": "redis", "redis_url": request.getfixturevalue("redis_url")}
    app = await start_server(
        sim_time_scale=1.0, sim_max_running_requests=1, **(extra if store == "redis" else {})
    )
    d = _dispatcher(app)
    async with AsyncClient(app.address) as c:
        running = c.generate("holds the only slot", max_tokens=5000)
        assert isinstance(await running.__anext__(), Delta)
        queued = [
            asyncio.create_task(c.complete(f"waits {i}", max_tokens=2, timeout_s=30))
            for i in range(3)
        ]
        await eventually(lambda: d.queued == 3, what="three queued requests")
        stop = asyncio.create_task(app.stop(grace_s=60))
        # Each queued request fails while the drain is still going on (the running
        # stream holds it open), with a retry hint pointing elsewhere.
        for task in queued:
            with pytest.raises(FairgateError) as err:
                await task
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert err.value.reason == "SERVER_SHUTTING_DOWN"
            assert err.value.retry_after_s is not None and err.value.retry_after_s > 0
        assert not stop.done() and d.in_flight == 1 and d.queued == 0
        # New connections still reach the server: health says NOT_SERVING ...
        assert await _health_on_new_connection(app.address) == NOT_SERVING
        assert await _health_on_new_connection(app.address, SERVICE_NAME) == NOT_SERVING
        # ... and new requests are refused the same way.
        async with AsyncClient(app.address) as late:
            with pytest.raises(FairgateError) as err:
                await late.complete("too late", max_tokens=2, timeout_s=5)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert err.value.retry_after_s is not None
        # A second signal cuts the drain short; the running stream gets its result.
        app.drain.cut_short()
        events = [ev async for ev in running]
        await stop
    assert isinstance(events[-1], Result) and events[-1].finish_reason == "cancelled"
    await assert_no_leaks(app)


async def test_stream_cut_before_its_first_token_is_unavailable(
    start_server: StartServer,
) -> None:
    # A huge prompt on the real-time simulator: admitted, still in prefill at the cut.
    app = await start_server(sim_time_scale=1.0, sim_chunked_prefill_tokens=64)
    async with AsyncClient(app.address) as c:
        task = asyncio.create_task(c.complete("word " * 20000, max_tokens=4, timeout_s=30))
        await eventually(lambda: app.drain.streams == 1, what="the request to be admitted")
        await app.stop(grace_s=0.0)
        with pytest.raises(FairgateError) as err:
            await task
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.reason == "SERVER_SHUTTING_DOWN"
    assert err.value.retry_after_s is not None
    await assert_no_leaks(app)


async def test_sigterm_drains_and_a_second_signal_cuts(tmp_path: object) -> None:
    """`fairgate serve` as a real process: SIGTERM starts the drain (NOT_SERVING on
    a new connection, the stream keeps going); a second SIGTERM cuts the stream,
    which ends with its final result, and the process exits 0."""
    env = {
        **os.environ,
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "",
        "FAIRGATE_SIM_TIME_SCALE": "1.0",
        "FAIRGATE_SHUTDOWN_GRACE_S": "600",
        "FAIRGATE_LOG_LEVEL": "WARNING",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairgate.cli.main", "serve", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        address = ""
        while not address:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, "server exited before listening"
            m = re.search(r"listening on (\S+)", line)
            address = m.group(1) if m else ""
        async with AsyncClient(address) as c:
            stream = c.generate("a long answer", max_tokens=5000)
            assert isinstance(await stream.__anext__(), Delta)
            proc.send_signal(signal.SIGTERM)

            async def not_serving() -> bool:
                return await _health_on_new_connection(address) == NOT_SERVING

            for _ in range(500):
                if await not_serving():
                    break
                await asyncio.sleep(0.01)
            assert await not_serving()
            assert proc.returncode is None  # draining, not gone
            proc.send_signal(signal.SIGTERM)
            events = [ev async for ev in stream]
        assert isinstance(events[-1], Result) and events[-1].finish_reason == "cancelled"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
