"""Streaming ceiling: bare grpc.aio vs fairgate on the zero-latency simulator.

Both servers run in a child process and send the same messages (one token per
TokenDelta, then a GenerateResult); the load generator runs here with the raw
stubs. For each concurrency level it measures streamed tokens/s and time to
first token, alternating the servers in one run so machine noise hits both.
A third column lets fairgate coalesce tokens that are ready together.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc

from fairgate.bench.common import fmt_ms, percentile, server_process
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc


@dataclass
class Sample:
    tokens: int = 0
    messages: int = 0
    streams: int = 0
    ttft_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s else 0.0


async def _drive(address: str, concurrency: int, tokens: int, duration_s: float) -> Sample:
    sample = Sample()
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(concurrency, 8))]
    stubs = [pb_grpc.InferenceServiceStub(ch) for ch in channels]
    req = pb.GenerateRequest(
        text="benchmark prompt", sampling=pb.SamplingParams(max_tokens=tokens, ignore_eos=True)
    )
    # Warm up connections before timing.
    await asyncio.gather(*(s.ListModels(pb.ListModelsRequest()) for s in stubs))
    stop_at = time.perf_counter() + duration_s

    async def worker(i: int) -> None:
        stub = stubs[i % len(stubs)]
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            first = True
            async for msg in stub.Generate(req):
                if msg.HasField("delta"):
                    if first:
                        sample.ttft_s.append(time.perf_counter() - t0)
                        first = False
                else:
                    sample.tokens += msg.result.usage.completion_tokens
                sample.messages += 1
            sample.streams += 1

    t_start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    sample.elapsed_s = time.perf_counter() - t_start
    for ch in channels:
        await ch.close()
    return sample


async def main(levels: list[int], tokens: int, duration_s: float, coalesce: bool) -> None:
    kv = max(200_000, max(levels) * (tokens + 16) * 2)
    fair_common = dict(
        sim_time_scale=0,
        sim_max_running_requests=max(levels) * 2,
        sim_kv_capacity_tokens=kv,
        default_max_tokens=tokens,
    )
    configs: list[tuple[str, str, dict[str, object]]] = [
        ("bare", "bare", {}),
        ("fairgate", "fairgate", {**fair_common, "stream_coalesce": "false"}),
    ]
    if coalesce:
        configs.append(
            ("fairgate+coalesce", "fairgate", {**fair_common, "stream_coalesce": "true"})
        )
    results: dict[tuple[str, int], Sample] = {}
    for name, mode, settings in configs:
        async with server_process(mode, **settings) as address:
            for c in levels:
                results[(name, c)] = await _drive(address, c, tokens, duration_s)
                tps = results[(name, c)].tokens_per_s
                print(f"  measured {name:18s} c={c:<4d} {tps:10.0f} tok/s", flush=True)
    print()
    print(f"streamed tokens/s and TTFT, {tokens} tokens per stream, {duration_s:g} s per cell")
    header = (
        f"{'streams':>7} | {'bare tok/s':>10} | {'fairgate tok/s':>14} | {'ratio':>5} | "
        f"{'TTFT p50 bare/fg ms':>19} | {'TTFT p99 bare/fg ms':>19} | {'added p50/p99 ms':>16}"
    )
    if coalesce:
        header += f" | {'coalesced tok/s':>15} | {'ratio':>5} | {'tok/msg':>7}"
    print(header)
    print("-" * len(header))
    for c in levels:
        bare, fg = results[("bare", c)], results[("fairgate", c)]
        b50, b99 = percentile(bare.ttft_s, 50), percentile(bare.ttft_s, 99)
        f50, f99 = percentile(fg.ttft_s, 50), percentile(fg.ttft_s, 99)
        row = (
            f"{c:>7} | {bare.tokens_per_s:>10.0f} | {fg.tokens_per_s:>14.0f} | "
            f"{fg.tokens_per_s / bare.tokens_per_s:>5.2f} | "
            f"{fmt_ms(b50):>9}/{fmt_ms(f50):<9} | {fmt_ms(b99):>9}/{fmt_ms(f99):<9} | "
            f"{fmt_ms(f50 - b50):>7}/{fmt_ms(f99 - b99):<8}"
        )
        if coalesce:
            co = results[("fairgate+coalesce", c)]
            per_msg = co.tokens / max(1, co.messages - co.streams)
            row += (
                f" | {co.tokens_per_s:>15.0f} | {co.tokens_per_s / bare.tokens_per_s:>5.2f} | "
                f"{per_msg:>7.1f}"
            )
        print(row)
