"""`fairgate bench gateway`: direct-to-worker vs fairgate (gRPC and HTTP fronts)
vs smg, in front of the same `fairgate sim-server` workers, in one run.

For each mode (zero-latency workers: the gateway is the bottleneck; real-time
simulated 4090s: the engine is), the workers start once and every target is
measured at every concurrency, repetitions interleaved (the order of targets
rotates each repetition) so machine noise hits all of them. A cell is a closed
loop: `c` streams draw from a fixed number of requests (prompt of 16 token ids,
`tokens` output tokens, ignore_eos). Per cell: output tokens/s, TTFT samples,
the gateway's CPU (its process tree, /proc) per streamed token and its RSS,
failures. Direct is the reference for the ratios and the added TTFT.

fairgate *variants* (`LABEL:key=value,...`, settings as in FAIRGATE_*) run as
extra targets in the same run, so an optimisation toggled by a setting is
measured side by side with the default. The key `src=DIR` runs a variant from
another fairgate checkout (say `git worktree add /tmp/before HEAD~3`), so code
before and after a change is measured in one interleaved run.

`capacity` adds real-time workers one at a time (`per_worker_c` streams each,
up to `max_workers`), marks each count that keeps fairgate's added TTFT p99
within `ttft_budget_ms` and its throughput over `min_ratio` × direct, and
prints the simulated 4090s fronted per core of fairgate CPU: the largest
passing count ÷ the cores it used, and for every count the workers' worth of
tokens it carried ÷ cores.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from fairgate.bench.common import free_port, rotated, server_child, source_checkout
from fairgate.bench.gateway_clients import (
    Caller,
    GrpcClient,
    OpenAiClient,
    Sample,
    SglangClient,
)
from fairgate.bench.gateway_processes import find_smg as find_smg  # "as": fleet*.py import it here
from fairgate.bench.gateway_processes import local_redis, sim_workers
from fairgate.bench.gateway_processes import smg_gateway as smg_gateway
from fairgate.bench.gateway_report import (
    Cell,
    print_capacity,
    print_cpu_ratios,
    print_mode,
    print_scaling,
)
from fairgate.bench.procstat import proc_cpu_s, tree_cpu_s, tree_rss_bytes
from fairgate.bench.redis_local import RedisServer

MODES = {"zero": 0.0, "real": 1.0}


@dataclass(frozen=True)
class Variant:
    label: str
    settings: dict[str, str] = field(default_factory=dict)
    src: str = ""  # another fairgate checkout to run this variant from ("": this one)


def parse_variant(text: str) -> Variant:
    """`LABEL` or `LABEL:key=value,key=value` (fairgate settings, lower case;
    `src=DIR`: run from that checkout)."""
    label, _, rest = text.partition(":")
    pairs = [p.split("=", 1) for p in rest.split(",") if p]
    if not label or any(len(p) != 2 for p in pairs):
        raise ValueError(f"bad variant {text!r}: expected LABEL[:key=value,...]")
    settings = {k: v for k, v in pairs}
    src = settings.pop("src", "")
    source_checkout(src)  # a bad checkout fails here, before any process starts
    return Variant(label, settings, src)


@dataclass
class Target:
    name: str
    call: Caller
    pid: int | None  # the gateway process (None: direct)
    # Processes whose CPU counts as the gateway's too (the redis-server of store=redis).
    helper_pids: tuple[int, ...] = ()
    # Processes counted without their children (SGLang's main process: its scheduler
    # and detokenizer children are the same behind every front).
    solo_pids: tuple[int, ...] = ()
    # `pid`'s own CPU only, not its children's (fairgate with the engine in-process).
    solo: bool = False

    def cpu_s(self) -> float:
        solo = sum(proc_cpu_s(p) for p in self.solo_pids)
        if self.pid is None:
            return solo
        mine = proc_cpu_s(self.pid) if self.solo else tree_cpu_s(self.pid)
        return mine + sum(tree_cpu_s(p) for p in self.helper_pids) + solo


def needs_redis(variants: Sequence[Variant]) -> bool:
    """A variant with store=redis (or workers > 1) and no redis_url of its own."""
    return any(
        (v.settings.get("store") == "redis" or int(v.settings.get("workers", "1")) > 1)
        and "redis_url" not in v.settings
        for v in variants
    )


def redis_settings(v: Variant, redis: RedisServer | None) -> dict[str, str]:
    """store=redis on the local server, a domain per variant (variants share nothing)."""
    if redis is None or "redis_url" in v.settings:
        return {}
    if v.settings.get("store") != "redis" and int(v.settings.get("workers", "1")) <= 1:
        return {}
    return {"store": "redis", "redis_url": redis.url, "redis_domain": f"bench-{v.label}"}


@asynccontextmanager
async def targets_for(
    worker_urls: list[str],
    variants: Sequence[Variant],
    http: bool,
    smg: str | None,
    grpc_channels: int = 1,
) -> AsyncIterator[list[Target]]:
    async with AsyncExitStack() as stack:
        direct = SglangClient(worker_urls)
        stack.push_async_callback(direct.aclose)
        targets = [Target("direct", direct, None)]
        redis = stack.enter_context(local_redis(needs_redis(variants)))
        for i, v in enumerate(variants):
            http_port = free_port()
            shared = redis_settings(v, redis)
            server = await stack.enter_async_context(
                server_child(
                    "fairgate",
                    src=v.src,
                    engine="sglang-http",
                    sglang_urls=",".join(worker_urls),
                    http_listen=f"127.0.0.1:{http_port}",
                    telemetry="off",
                    **{**v.settings, **shared},
                )
            )
            helpers = (redis.proc.pid,) if shared and redis and redis.proc else ()
            g = GrpcClient(server.address, grpc_channels)
            stack.push_async_callback(g.aclose)
            targets.append(Target(f"{v.label} grpc", g, server.pid, helpers))
            if http and i == 0:  # the HTTP front of the first variant only
                h = OpenAiClient(f"http://127.0.0.1:{http_port}")
                stack.push_async_callback(h.aclose)
                targets.append(Target(f"{v.label} http", h, server.pid, helpers))
        if smg is not None:
            url, pid = await stack.enter_async_context(smg_gateway(smg, worker_urls))
            s = SglangClient([url])
            stack.push_async_callback(s.aclose)
            targets.append(Target("smg", s, pid))
        yield targets


async def run_cell(target: Target, c: int, requests: int, tokens: int) -> Cell:
    samples: list[Sample] = []
    left = requests

    async def stream() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            samples.append(await target.call(tokens))

    # Open the c connections first (a pool's idle ones may have timed out while
    # other targets ran): connection setup is not what a cell measures.
    await asyncio.gather(*(target.call(2) for _ in range(c)))
    cpu0 = target.cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(c)))
    wall_s = time.perf_counter() - t0
    cpu_s = target.cpu_s() - cpu0
    rss = tree_rss_bytes(target.pid) if target.pid else math.nan
    return Cell(target.name, c, wall_s, samples, cpu_s, rss)


def requests_for(c: int, tokens: int, waves: int, budget_tokens: int) -> int:
    """At least `waves` requests per stream, 8 in all and `budget_tokens`, whole waves."""
    n = max(c * waves, 8, math.ceil(budget_tokens / tokens))
    return math.ceil(n / c) * c


async def warm(targets: Sequence[Target], tokens: int) -> None:
    for t in targets:
        await asyncio.gather(*(t.call(tokens) for _ in range(4)))


async def run_mode(
    mode: str,
    workers: int,
    levels: Sequence[int],
    reps: int,
    tokens: int,
    waves: int,
    budget_tokens: int,
    variants: Sequence[Variant],
    http: bool,
    smg: str | None,
    incremental: bool = False,
    grpc_channels: int = 1,
) -> list[Cell]:
    cells: list[Cell] = []
    async with (
        sim_workers(workers, MODES[mode], max(max(levels), 256), incremental) as urls,
        targets_for(urls, variants, http, smg, grpc_channels) as targets,
    ):
        await warm(targets, tokens)
        for rep in range(reps):
            for c in levels:
                # Real time: the engine sets the pace, so no token budget (c=1 would crawl).
                budget = budget_tokens if mode == "zero" else 0
                n = requests_for(c, tokens, waves, budget)
                for target in rotated(targets, rep):
                    cells.append(await run_cell(target, c, n, tokens))
                print(f"  {mode}: repetition {rep + 1}/{reps}, c={c} done", flush=True)
    return cells


async def capacity(
    per_worker_c: int,
    max_workers: int,
    reps: int,
    tokens: int,
    variant: Variant,
    ttft_budget_ms: float,
    min_ratio: float,
    incremental: bool = False,
    grpc_channels: int = 1,
) -> None:
    rows: list[tuple[int, list[Cell]]] = []
    for n in range(1, max_workers + 1):
        c = per_worker_c * n
        async with (
            sim_workers(n, MODES["real"], max(per_worker_c, 256), incremental) as urls,
            targets_for(urls, [variant], False, None, grpc_channels) as targets,
        ):
            await warm(targets, tokens)
            cells = []
            for rep in range(reps):
                for target in rotated(targets, rep):
                    cells.append(await run_cell(target, c, 2 * c, tokens))
        rows.append((n, cells))
        print(f"  capacity: {n} worker(s) done", flush=True)
    print_capacity(rows, ttft_budget_ms, min_ratio, final=True)


def _uptime() -> str:
    try:
        with open("/proc/loadavg") as f:
            return "load average " + " ".join(f.read().split()[:3])
    except OSError:
        return "load average unknown"


async def main(
    *,
    modes: Sequence[str],
    workers: int,
    levels: Sequence[int],
    reps: int,
    tokens: int,
    waves: int,
    budget_tokens: int,
    variants: Sequence[Variant],
    http: bool,
    smg_binary: str | None,
    capacity_workers: int,
    per_worker_c: int,
    incremental: bool = False,
    grpc_channels: int = 1,
) -> None:
    smg = None if smg_binary is None else find_smg(smg_binary)
    streaming = "incremental" if incremental else "cumulative (SGLang's default)"
    print(
        f"machine: {_uptime()}, {os.cpu_count()} cores; "
        f"smg: {smg or 'not installed (pip install smg)'}; workers stream {streaming} output"
    )
    if needs_redis(variants):
        print("store=redis variants: a local redis-server's CPU counts as theirs")
    if grpc_channels > 1:
        print(f"gRPC targets: calls round-robin over {grpc_channels} connections")
    for mode in modes:
        cells = await run_mode(
            mode,
            workers,
            levels,
            reps,
            tokens,
            waves,
            budget_tokens,
            variants,
            http,
            smg,
            incremental,
            grpc_channels,
        )
        print_mode(mode, workers, tokens, reps, cells)
        print_scaling(cells, [f"{v.label} grpc" for v in variants])
        print_cpu_ratios(cells, [f"{v.label} grpc" for v in variants], "smg")
    if capacity_workers:
        await capacity(
            per_worker_c,
            capacity_workers,
            reps,
            tokens,
            variants[0],
            5.0,
            0.95,
            incremental,
            grpc_channels,
        )
    print(f"machine after: {_uptime()}")
