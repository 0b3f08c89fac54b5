"""The two library floors under fairgate's CPU per streamed token, measured alone.

    python -m fairgate.bench.floors [--streams 64] [--tokens 256] [--seconds 8]

A streamed token crosses two libraries in fairgate: grpc.aio sends it to the
client (one message) and the adapter's HTTP client (`sse_client.py`, httptools)
reads it from the SGLang worker (one SSE event). This measures each with nothing
of fairgate around it, in front of one real-time `sim-server` (`streams`
requests of `tokens` tokens, closed loop):

- grpc: a bare grpc.aio InferenceService (no auth, admission or engine) whose
  streams each yield one TokenDelta per tick of one shared timer (a decode
  step: `--step-ms`), driven by a grpc.aio client in this process; its CPU
  from /proc per message;
- aiohttp: `POST /generate` and `readany()` until the end, nothing parsed (what
  the adapter read with before `sse_client.py`: the reference);
- sse_client: `SsePool.post` and `payloads()` until the end (HTTP and SSE
  split, no JSON);
- adapter: `SglangHttpEngine.generate` (sse_client, orjson, the decoder).

The last three run in this process one at a time: CPU (process_time) per event.
Compare with `fairgate bench gateway` in the same minutes: fairgate ≈ grpc +
adapter, smg is the same hop outside Python.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import aiohttp
import grpc
import orjson

from fairgate.bench.common import child_server
from fairgate.bench.gateway_processes import sim_workers
from fairgate.bench.procstat import proc_cpu_s
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc


class _Bare(pb_grpc.InferenceServiceServicer):
    """Generate: `max_tokens` one-token deltas, one per tick, then a result."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.tick: asyncio.Future[None] | None = None

    async def ticker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.tick = loop.create_future()
            await asyncio.sleep(self.step_s)
            self.tick.set_result(None)

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        for i in range(request.sampling.max_tokens):
            assert self.tick is not None
            await asyncio.shield(self.tick)
            response = pb.GenerateResponse()
            response.delta.text, response.delta.index = " tok", i
            yield response
        yield pb.GenerateResponse(result=pb.GenerateResult(request_id=request.request_id))


async def serve_bare(step_s: float) -> None:
    """Child mode: print `PORT n`, serve until stdin closes (common.child_server)."""
    servicer = _Bare(step_s)  # type: ignore[abstract]  # only Generate is served
    server = grpc.aio.server()
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ticker = asyncio.create_task(servicer.ticker())
    print(f"PORT {port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    ticker.cancel()
    await server.stop(0)


Request = Callable[[Callable[[int], None]], Awaitable[None]]


async def _closed_loop(streams: int, warmup_s: float, seconds: float, one: Request) -> float:
    """Run `one(tally)` (a request that tallies the items it streams, as they come)
    on `streams` loops; items per second after the warm-up (the caller reads
    the CPU around the same window)."""
    count, stop = 0, False

    def tally(n: int) -> None:
        nonlocal count
        count += n

    async def loop() -> None:
        while not stop:
            await one(tally)

    tasks = [asyncio.create_task(loop()) for _ in range(streams)]
    await asyncio.sleep(warmup_s)
    start, started_s = count, time.monotonic()
    await asyncio.sleep(seconds)
    rate = (count - start) / (time.monotonic() - started_s)
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    return rate


async def grpc_floor(args: argparse.Namespace) -> tuple[float, float]:
    """(messages/s, CPU µs per message) of the bare grpc.aio server."""
    step = f"--step-ms={args.step_ms}"
    async with child_server("fairgate.bench.floors", "serve-bare", step) as server:
        channel = grpc.aio.insecure_channel(server.address)
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=args.tokens))

        async def one(tally: Callable[[int], None]) -> None:
            async for response in stub.Generate(request):
                tally(response.HasField("delta"))

        cpu = [proc_cpu_s(server.pid)]
        rate = await _measured(args, one, lambda: cpu.append(proc_cpu_s(server.pid)))
        await channel.close()
    return rate, (cpu[2] - cpu[1]) / (rate * args.seconds) * 1e6


async def _measured(args: argparse.Namespace, one: Request, mark: Callable[[], None]) -> float:
    # Marks the CPU at the end of the warm-up and at the end of the window.
    loop_task = asyncio.create_task(_closed_loop(args.streams, args.warmup_s, args.seconds, one))
    await asyncio.sleep(args.warmup_s)
    mark()
    await asyncio.sleep(args.seconds)
    mark()
    return await loop_task


async def in_process_floor(args: argparse.Namespace, url: str, mode: str) -> float:
    """CPU µs per SSE event read in this process: aiohttp alone, sse_client alone,
    or the adapter."""
    from service.engines.protocol import EngineRequest, SamplingOptions
    from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
    from service.engines.sse_pool import SsePool

    prompt = list(range(1, 17))
    engine = SglangHttpEngine(SglangHttpConfig(url))
    await engine.start()
    session = aiohttp.ClientSession()
    body = orjson.dumps(
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": args.tokens, "ignore_eos": True},
            "stream": True,
        }
    )
    sampling = SamplingOptions(ignore_eos=True)
    pool = SsePool(url, connect_timeout_s=5.0)
    json_headers = {"Content-Type": "application/json"}

    async def raw(tally: Callable[[int], None]) -> None:
        async with session.post(url + "/generate", data=body) as resp:
            while piece := await resp.content.readany():
                tally(piece.count(b"\n\n"))  # one more for [DONE]: 1 in `tokens`

    async def sse(tally: Callable[[int], None]) -> None:
        conn = await pool.post("/generate", body, json_headers)
        while payloads := await conn.payloads():
            tally(len(payloads))  # one more for [DONE]: 1 in `tokens`
        pool.release(conn)

    async def through_adapter(tally: Callable[[int], None]) -> None:
        req = EngineRequest(
            request_id="floor", prompt_token_ids=prompt, max_tokens=args.tokens, sampling=sampling
        )
        async for chunk in engine.generate(req):
            tally(len(chunk.token_ids))

    cpu: list[float] = []
    one = {"aiohttp": raw, "sse": sse, "adapter": through_adapter}[mode]
    rate = await _measured(args, one, lambda: cpu.append(time.process_time()))
    await session.close()
    await pool.aclose()
    await engine.aclose()
    seconds: float = args.seconds
    return (cpu[1] - cpu[0]) / (rate * seconds) * 1e6


async def main(args: argparse.Namespace) -> None:
    async with sim_workers(1, 1.0, max_running=256) as (url,):
        rate, grpc_us = await grpc_floor(args)
        print(f"grpc.aio bare server: {rate:.0f} msg/s, {grpc_us:.1f} µs CPU per message")
        raw_us = await in_process_floor(args, url, "aiohttp")
        print(f"aiohttp read alone:   {raw_us:.1f} µs CPU per SSE event")
        sse_us = await in_process_floor(args, url, "sse")
        print(f"sse_client alone:     {sse_us:.1f} µs CPU per SSE event")
        adapter_us = await in_process_floor(args, url, "adapter")
        print(f"SGLang HTTP adapter:  {adapter_us:.1f} µs CPU per token")
        print(f"grpc + adapter:       {grpc_us + adapter_us:.1f} µs per token")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fairgate.bench.floors")
    p.add_argument("mode", nargs="?", default="measure", choices=["measure", "serve-bare"])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--seconds", type=float, default=8.0, help="measured window")
    p.add_argument("--warmup-s", type=float, default=3.0, help="streams run before it")
    p.add_argument("--step-ms", type=float, default=12.5, help="bare server's decode step")
    return p.parse_args(argv)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    # uvloop when installed, as fairgate's server runs (service/event_loop.py).
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


if __name__ == "__main__":
    options = parse(sys.argv[1:])
    _run(serve_bare(options.step_ms / 1000) if options.mode == "serve-bare" else main(options))
