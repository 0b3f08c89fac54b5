"""Three fairgate processes sharing one Redis and one engine (the SGLang stand-in).

Checks, fleet-wide: weighted shares of tenants with weights 1:2:4, all
backlogged on every replica, within 5 % of the weights; a token-quota tenant
admitted within one request of its quota; the engine never holds more
requests than its limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from fairgate import AsyncClient, Delta, FairgateError

from service.engines.protocol import EngineRequest
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.simulator.http_server import SimServer

REPLICAS = 3
SLOTS = 8
PROMPT, OUTPUT = 16, 32
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 4.0}
QUOTA_TOKENS_PER_S, QUOTA_BURST = 40.0, 200.0
TENANTS = f"""
tenants:
  - {{id: a, weight: 1}}
  - {{id: b, weight: 2}}
  - {{id: c, weight: 4}}
  - id: q
    weight: 1
    over_quota: wait
    quotas: {{tokens_per_min: {QUOTA_TOKENS_PER_S * 60:g}, tokens_burst: {QUOTA_BURST:g}}}
"""
WARMUP_S, MEASURE_S = 1.5, 10.0


class CountingSim(SimServer):
    """The stand-in, counting the streams it holds at once."""

    live = 0
    max_live = 0

    async def _stream(self, request: web.Request, req: EngineRequest) -> web.StreamResponse:
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        try:
            return await super()._stream(request, req)
        finally:
            self.live -= 1


@dataclass
class Record:
    # tenant -> [(time, weighted service)]
    service: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    admitted: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    by_replica: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    errors: list[str] = field(default_factory=list)


async def _replica(env: dict[str, str]) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fairgate.cli.main",
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line, "replica exited before listening"
        m = re.search(r"listening on (\S+)", line)
        if m:
            return proc, m.group(1)


@pytest.fixture
async def fleet(redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[list[str], CountingSim]]:
    sim = CountingSim(
        SimulatedEngine(SimConfig(cost=preset(), max_running_requests=SLOTS), time_scale=0.25)
    )
    await sim.start()
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    env = {
        **os.environ,
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_ENGINE": "sglang-http",
        "FAIRGATE_SGLANG_URLS": sim.url,
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REPLICAS": str(REPLICAS),
        "FAIRGATE_REDIS_POLL_MS": "5",
        "FAIRGATE_TENANTS_FILE": str(tenants),
        "FAIRGATE_LOG_LEVEL": "WARNING",
        "FAIRGATE_SHUTDOWN_GRACE_S": "1",
    }
    started = await asyncio.gather(*(_replica(env) for _ in range(REPLICAS)))
    procs = [p for p, _ in started]
    try:
        yield [a for _, a in started], sim
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.wait(), 10)
        await sim.stop()


async def _loop(c: AsyncClient, tenant: str, replica: int, rec: Record) -> None:
    """Closed loop until cancelled; a request's admission is dated by its first token."""
    while True:
        first = True
        try:
            async for ev in c.generate(
                [17] * PROMPT, max_tokens=OUTPUT, ignore_eos=True, return_token_ids=True
            ):
                if isinstance(ev, Delta):
                    now_s = time.monotonic()
                    if first:
                        first = False
                        rec.admitted[tenant].append(now_s)
                        rec.service[tenant].append((now_s, 1.0 * PROMPT))
                        rec.by_replica[replica] += 1
                    rec.service[tenant].append((now_s, 2.0 * len(ev.token_ids)))
        except FairgateError as exc:
            rec.errors.append(f"{tenant}@{replica}: {exc}")
            return


async def test_three_replicas_share_fairness_quotas_and_engine_room(
    fleet: tuple[list[str], CountingSim],
) -> None:
    addresses, sim = fleet
    rec = Record()
    start_s = time.monotonic()
    stop_s = start_s + WARMUP_S + MEASURE_S
    clients = [AsyncClient(a, tenant=t) for a in addresses for t in (*WEIGHTS, "q")]
    loops = []
    for k, c in enumerate(clients):
        replica, tenant = divmod(k, len(WEIGHTS) + 1)
        tenant_id = [*WEIGHTS, "q"][tenant]
        for _ in range(4 if tenant_id != "q" else 2):
            loops.append(asyncio.create_task(_loop(c, tenant_id, replica, rec)))
    await asyncio.sleep(stop_s - time.monotonic())
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    for c in clients:
        await c.close()
    assert not rec.errors

    # The engine never held more than its limit, although 3 replicas admitted into it.
    assert sim.max_live <= SLOTS
    assert all(rec.by_replica[r] > 0 for r in range(REPLICAS))

    # Weighted shares over the window in which every tenant was backlogged.
    lo, hi = start_s + WARMUP_S, stop_s
    service = {t: sum(s for at, s in rec.service[t] if lo <= at < hi) for t in WEIGHTS}
    total_service, total_weight = sum(service.values()), sum(WEIGHTS.values())
    shares = {t: service[t] / total_service for t in WEIGHTS}
    for t, w in WEIGHTS.items():
        assert shares[t] == pytest.approx(w / total_weight, rel=0.05), (shares, service)

    # The quota tenant: admitted tokens = its burst + rate x time, within one request.
    first = min(rec.admitted["q"])
    last = max(t for t in rec.admitted["q"] if t < stop_s)
    admitted_tokens = len(rec.admitted["q"]) * (PROMPT + OUTPUT)
    allowed = QUOTA_BURST + QUOTA_TOKENS_PER_S * (last - first)
    assert allowed - (PROMPT + OUTPUT) <= admitted_tokens <= allowed + 1, (admitted_tokens, allowed)
