"""`fairgate bench http-overhead`: the OpenAI HTTP front's server CPU per streamed
token next to the gRPC API's, on one fairgate process.

One fairgate server runs in a child process with both fronts on, in front of
the zero-latency simulator without coalescing (one token per message: the
per-message cost is what is measured). Rounds alternate the protocols so
machine noise hits both; each round sends the same closed-loop requests
(token-id prompt, `max_tokens`, `ignore_eos`) over gRPC (fairgate's client)
or `POST /v1/completions` with `stream: true` (aiohttp, as OpenAI clients
do). The server's CPU (user + system, from /proc) per streamed token is
printed per protocol with the ratio HTTP ÷ gRPC.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from fairgate.aio import AsyncClient
from fairgate.bench.common import free_port, server_child
from fairgate.types import Result

PROMPT = [17] * 16


@dataclass
class Tally:
    cpu_s: float = 0.0
    tokens: int = 0
    requests: int = 0

    @property
    def us_per_token(self) -> float:
        return self.cpu_s / max(1, self.tokens) * 1e6


async def _grpc_round(address: str, n: int, concurrency: int, tokens: int) -> int:
    async with AsyncClient(address) as client:
        queue = list(range(n))
        total = 0

        async def worker() -> None:
            nonlocal total
            while queue:
                queue.pop()
                async for ev in client.generate(PROMPT, max_tokens=tokens, ignore_eos=True):
                    if isinstance(ev, Result):
                        total += ev.usage.completion_tokens

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total


async def _http_round(url: str, n: int, concurrency: int, tokens: int) -> int:
    body = {
        "prompt": PROMPT,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    queue = list(range(n))
    total = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            nonlocal total
            while queue:
                queue.pop()
                async with session.post(f"{url}/v1/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.content:
                        if line.startswith(b'data: {"id"') and b'"usage":{' in line:
                            total += int(line.split(b'"completion_tokens":')[1].split(b",")[0])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total


async def measure(requests: int, concurrency: int, tokens: int, rounds: int) -> tuple[Tally, Tally]:
    http_port = free_port()
    async with server_child(
        "fairgate",
        sim_time_scale=0,
        stream_coalesce="false",
        http_listen=f"127.0.0.1:{http_port}",
        telemetry="off",
    ) as server:
        url = f"http://127.0.0.1:{http_port}"
        # Warm both paths (imports, pools, JIT-free but cache-warm).
        await _grpc_round(server.address, concurrency, concurrency, tokens)
        await _http_round(url, concurrency, concurrency, tokens)
        grpc_t, http_t = Tally(), Tally()
        for _ in range(rounds):
            for tally, run in ((grpc_t, _grpc_round), (http_t, _http_round)):
                target = server.address if tally is grpc_t else url
                before = server.cpu_s()
                tally.tokens += await run(target, requests, concurrency, tokens)
                tally.cpu_s += server.cpu_s() - before
                tally.requests += requests
        return grpc_t, http_t


def report(grpc_t: Tally, http_t: Tally) -> str:
    ratio = http_t.us_per_token / max(grpc_t.us_per_token, 1e-9)
    return (
        f"server CPU per streamed token: gRPC {grpc_t.us_per_token:.1f} µs "
        f"({grpc_t.tokens} tokens, {grpc_t.requests} requests), "
        f"HTTP {http_t.us_per_token:.1f} µs ({http_t.tokens} tokens, {http_t.requests} requests); "
        f"HTTP ÷ gRPC = {ratio:.2f}"
    )


async def main(requests: int, concurrency: int, tokens: int, rounds: int) -> None:
    grpc_t, http_t = await measure(requests, concurrency, tokens, rounds)
    print(report(grpc_t, http_t))
