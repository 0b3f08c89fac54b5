"""A replica SIGKILLed with the engine full: its leases expire, the survivor gets
the whole engine back, and the engine never holds more than its limit.

Two `fairgate serve` processes share one Redis and one engine (the SGLang
stand-in); judged on the server side: the fleet's in-flight count in Redis and
the streams the engine holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from fairgate import AsyncClient

from scheduler.state.redis_store import RedisStore
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from tests.helpers import eventually
from tests.integration.serve_process import start_serve
from tests.integration.test_replicas import CountingSim

SLOTS = 4
LEASE_TTL_S = 2.0
DOMAIN = "replica-kill"


async def test_a_killed_replica_gives_its_engine_room_back(redis_url: str, tmp_path: Path) -> None:
    sim = CountingSim(
        SimulatedEngine(SimConfig(cost=preset(), max_running_requests=SLOTS), time_scale=1.0)
    )
    await sim.start()
    env = {
        **os.environ,
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "",
        "FAIRGATE_ENGINE": "sglang-http",
        "FAIRGATE_SGLANG_URLS": sim.url,
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REDIS_DOMAIN": DOMAIN,
        "FAIRGATE_REDIS_LEASE_TTL_S": str(LEASE_TTL_S),
        "FAIRGATE_REDIS_POLL_MS": "5",
        "FAIRGATE_LOG_LEVEL": "WARNING",
        "FAIRGATE_SHUTDOWN_GRACE_S": "1",
    }
    (doomed, doomed_addr, _), (survivor, survivor_addr, _) = await asyncio.gather(
        start_serve(env), start_serve(env)
    )
    store = RedisStore.from_url(redis_url, domain=DOMAIN)
    tasks: list[asyncio.Task[object]] = []
    try:
        doomed_client = AsyncClient(doomed_addr, tenant="a")
        # The doomed replica fills the engine with long streams.
        tasks += [
            asyncio.create_task(doomed_client.complete("long", max_tokens=4000))
            for _ in range(SLOTS)
        ]

        async def fleet_in_flight() -> int:
            return (await store.snapshot()).in_flight

        await eventually(
            lambda: sim.live == SLOTS, timeout_s=30, what="the doomed replica fills the engine"
        )
        doomed.send_signal(signal.SIGKILL)
        await doomed.wait()
        assert await fleet_in_flight() == SLOTS  # its leases outlive it, for now

        async with AsyncClient(survivor_addr, tenant="b") as c:
            # The survivor fills the whole engine once the dead replica's leases expire.
            done = await asyncio.wait_for(
                asyncio.gather(*(c.complete("after", max_tokens=8) for _ in range(2 * SLOTS))),
                timeout=LEASE_TTL_S + 30,
            )
        assert all(r.result.finish_reason == "length" for r in done)
        assert sim.max_live <= SLOTS  # never more than the engine's limit
        for _ in range(100):  # the survivor hands Redis its last settlements
            snap = await store.snapshot()
            if snap.in_flight == 0:
                break
            await asyncio.sleep(0.05)
        assert snap.in_flight == 0 and not snap.leases and not snap.concurrency
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(ProcessLookupError):
            survivor.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(survivor.wait(), 10)
        await store.aclose()
        await sim.stop()
