"""What the SGLang HTTP adapter path costs, per request and per token, vs in-process.

Both sides run the same zero-latency simulator (time scale 0), so what is
measured is pure plumbing: on one side fairgate's engine stream straight from
the in-process simulator; on the other the HTTP adapter streaming SSE from the
SGLang stand-in (`sim-server`) in a child process, with cumulative output
(SGLang's default) and with `--incremental-streaming-output`.

For each concurrency, each path runs closed-loop streams of 1 token and of
`tokens` tokens; per-request cost = time per 1-token request, per-token cost =
the extra time per extra token. Wall time is throughput-bound time (elapsed /
requests); CPU is this process's CPU (the gateway's share). The paths are
measured in one run, and the ratios to the in-process path are printed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

from fairgate.bench.common import child_server
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset


@dataclass
class Cost:
    wall_s: float
    cpu_s: float
    requests: int


@asynccontextmanager
async def stand_in(max_running: int, kv_tokens: int, incremental: bool) -> AsyncIterator[str]:
    args = [
        "--announce",
        "--port=0",
        "--time-scale=0",
        f"--max-running-requests={max_running}",
        f"--kv-capacity-tokens={kv_tokens}",
    ]
    if incremental:
        args.append("--incremental-streaming-output")
    async with child_server("service.engines.simulator.http_server", *args) as server:
        yield f"http://{server.address}"


async def _drive(
    engine: SimulatedEngine | SglangHttpEngine, concurrency: int, tokens: int, per_worker: int
) -> Cost:
    generate = engine.generate
    counter = iter(range(10**9))

    async def worker() -> None:
        for _ in range(per_worker):
            req = EngineRequest(
                request_id=f"b{next(counter)}",
                prompt_token_ids=[300 + i for i in range(16)],
                max_tokens=tokens,
                sampling=SamplingOptions(ignore_eos=True, seed=1),
            )
            async with aclosing(generate(req)) as stream:
                async for chunk in stream:
                    if chunk.finish is not None:
                        break

    await asyncio.gather(*(worker() for _ in range(min(concurrency, 8))))  # warm up
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Cost(time.perf_counter() - t0, time.process_time() - cpu0, concurrency * per_worker)


def _per(one: Cost, many: Cost, tokens: int) -> tuple[float, float, float, float]:
    """(wall µs/request, wall µs/token, cpu µs/request, cpu µs/token)."""
    w1, wn = one.wall_s / one.requests, many.wall_s / many.requests
    c1, cn = one.cpu_s / one.requests, many.cpu_s / many.requests
    extra = max(tokens - 1, 1)
    return w1 * 1e6, (wn - w1) / extra * 1e6, c1 * 1e6, (cn - c1) / extra * 1e6


async def main(levels: list[int], tokens: int, per_worker: int) -> None:
    top = max(levels)
    kv = max(200_000, top * (tokens + 32) * 2)
    config = SimConfig(cost=preset(), max_running_requests=top * 2, kv_capacity_tokens=kv)
    results: dict[tuple[str, int], tuple[float, float, float, float]] = {}

    inproc = SimulatedEngine(config, time_scale=0.0)
    await inproc.start()
    for c in levels:
        one = await _drive(inproc, c, 1, per_worker)
        many = await _drive(inproc, c, tokens, per_worker)
        results[("in-process", c)] = _per(one, many, tokens)
        print(f"  measured in-process          c={c}", flush=True)
    await inproc.aclose()

    for name, incremental in (("http cumulative", False), ("http incremental", True)):
        async with stand_in(top * 2, kv, incremental) as url:
            engine = SglangHttpEngine(SglangHttpConfig(url=url, retries=0))
            await engine.start()
            for c in levels:
                one = await _drive(engine, c, 1, per_worker)
                many = await _drive(engine, c, tokens, per_worker)
                results[(name, c)] = _per(one, many, tokens)
                print(f"  measured {name:20s} c={c}", flush=True)
            await engine.aclose()

    print()
    print(
        f"SGLang HTTP adapter vs in-process simulator, {tokens} tokens per stream, "
        f"{per_worker} streams per worker (zero-latency engine; µs, lower is better)"
    )
    header = (
        f"{'streams':>7} | {'path':<16} | {'wall/req':>8} | {'x':>5} | {'wall/tok':>8} | "
        f"{'x':>5} | {'cpu/req':>8} | {'x':>5} | {'cpu/tok':>8} | {'x':>5}"
    )
    print(header)
    print("-" * len(header))
    for c in levels:
        base = results[("in-process", c)]
        for name in ("in-process", "http cumulative", "http incremental"):
            r = results[(name, c)]
            cells = [f"{v:>8.1f} | {_ratio(v, b):>5}" for v, b in zip(r, base, strict=True)]
            print(f"{c:>7} | {name:<16} | " + " | ".join(cells))
    print(
        "\nx = ratio to the in-process path in the same run. cpu = this process "
        "(the gateway's share); the stand-in's own CPU is in a child process."
    )


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.1f}" if base > 0 else "-"
