"""Locality with and without KV events, through the pool, over simulators.

    .venv/bin/python -m tests.measure_kv_events [--workers 2] [--seed 1]

Prefix-heavy traffic that makes the engines evict: `PREFIXES` system prompts of
`PREFIX_TOKENS` each (more than the workers' KV together), requests picking one
at random (a few hot ones more often) with their own question; at most
`CONCURRENCY` in flight. Printed per mode: the prompt tokens the workers reported
cached (hit rate), and the requests routed for a prefix the worker no longer
held (`Placement.overestimated`: the engine reported fewer cached tokens than the
routing counted on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

from fairgate.bench.common import free_port

from service.engines.kv_events import KvEventsFollower
from service.engines.pool import WorkerPool
from service.engines.protocol import EngineRequest
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.simulator.kv_events import SimKvEventsPublisher
from service.engines.simulator.sim_server import SimServer

KV_TOKENS = 8192  # each worker's
PREFIXES = 24
PREFIX_TOKENS = 1000
REQUESTS = 400
CONCURRENCY = 8


async def run(events: bool, workers: int, seed: int) -> dict[str, float]:
    servers, publishers, followers = [], [], []
    for _ in range(workers):
        engine = SimulatedEngine(
            SimConfig(cost=preset(), kv_capacity_tokens=KV_TOKENS, max_running_requests=16),
            time_scale=0.05,
        )
        server = SimServer(engine)
        await server.start()
        servers.append(server)
        if events:
            port = free_port()
            pub = SimKvEventsPublisher(
                json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}"})
            )
            engine.core.observe_cache(pub)
            publishers.append(pub)
            followers.append(KvEventsFollower(f"tcp://127.0.0.1:{port}"))
    pool = WorkerPool(
        [SglangHttpEngine(SglangHttpConfig(url=s.url)) for s in servers],
        kv_events=followers,
    )
    await pool.start()
    for pub, f in zip(publishers, followers, strict=True):  # the SUB joins before traffic
        while f.batches == 0:
            pub.cleared()
            await asyncio.sleep(0.01)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(10, 30000) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    weights = [1.0 / (k + 1) for k in range(PREFIXES)]  # a few hot, a long tail
    prompts = [
        [*rng.choices(prefixes, weights)[0], *(rng.randrange(10, 30000) for _ in range(60))]
        for _ in range(REQUESTS)
    ]
    gate = asyncio.Semaphore(CONCURRENCY)
    prompt_tokens = cached = 0

    async def one(n: int, prompt: list[int]) -> None:
        nonlocal prompt_tokens, cached
        async with gate:
            req = EngineRequest(
                request_id=f"r{n}",
                prompt_token_ids=prompt,
                max_tokens=16,
                prefix_keys=pool.placement.prefix_keys(prompt),
            )
            last = None
            async for chunk in pool.generate(req):
                last = chunk
            assert last is not None
            prompt_tokens += len(prompt)
            cached += last.cached_tokens

    try:
        await asyncio.gather(*(one(n, p) for n, p in enumerate(prompts)))
    finally:
        await pool.aclose()
        for s in servers:
            await s.stop()
        for pub in publishers:
            pub.close()
    return {
        "hit_rate": cached / prompt_tokens,
        "overestimated": pool.placement.overestimated,
        "stale_views": sum(not f.exact for f in followers),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for events in (False, True):
        r = asyncio.run(run(events, a.workers, a.seed))
        print(
            f"events={'on ' if events else 'off'} workers={a.workers} seed={a.seed}: "
            f"cached-token hit rate {r['hit_rate']:.3f}, "
            f"routed on a prefix no longer held {r['overestimated']}/{REQUESTS}, "
            f"stale views {r['stale_views']}"
        )


if __name__ == "__main__":
    main()
