"""`fairgate sim-server` / `python -m service.engines.simulator.http_server`: the
simulated engine's SGLang-style HTTP server as a process, with SGLang's flags.

`--announce` (for child processes: tests, benchmarks) prints `PORT n` once bound
and exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib

from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.sim_server import SimServer


async def serve_forever(server: SimServer, host: str, port: int, announce: bool = False) -> None:
    """Run until SIGINT/SIGTERM (or stdin closes, with `announce`, for child processes)."""
    import signal

    bound = await server.start(host, port)
    print(f"PORT {bound}" if announce else f"sim-server on http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if announce:
        import sys

        waiter = loop.run_in_executor(None, sys.stdin.read)
        waiter.add_done_callback(lambda _: loop.call_soon_threadsafe(stop.set))
    await stop.wait()
    with contextlib.suppress(asyncio.CancelledError):
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    import argparse

    from service.engines.simulator.core import SimConfig
    from service.engines.simulator.hardware import preset

    p = argparse.ArgumentParser(description="fairgate's simulated engine on SGLang's HTTP API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default="llama-3.1-8b-int4")
    p.add_argument("--gpu", default="rtx-4090")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--max-queued-requests", type=int, default=0)
    p.add_argument("--kv-capacity-tokens", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--enable-priority-scheduling", action="store_true")
    p.add_argument("--disable-priority-preemption", action="store_true")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument(
        "--priority-scheduling-preemption-threshold", type=int, default=SGLANG_PREEMPTION_THRESHOLD
    )
    p.add_argument(
        "--kv-events-config",
        default="",
        help='SGLang\'s flag: publish KV cache events, e.g. {"publisher":"zmq","endpoint":"tcp://*:5557"}',
    )
    p.add_argument("--announce", action="store_true", help="print PORT n; exit when stdin closes")
    # Fault switches for tests with real processes (see `Faults`).
    p.add_argument("--fault-garble-after-chunks", type=int, default=None)
    p.add_argument("--fault-stall-after-chunks", type=int, default=None)
    a = p.parse_args(argv)
    config = SimConfig(
        cost=preset(a.gpu, a.model),
        max_running_requests=a.max_running_requests,
        max_queued_requests=a.max_queued_requests or None,
        kv_capacity_tokens=a.kv_capacity_tokens or None,
        seed=a.seed,
        prefix_cache=not a.disable_radix_cache,
        priority_scheduling=a.enable_priority_scheduling,
        priority_preemption_threshold=(
            None if a.disable_priority_preemption else a.priority_scheduling_preemption_threshold
        ),
    )

    async def run() -> None:
        engine = SimulatedEngine(config, time_scale=a.time_scale)
        if a.kv_events_config:
            from service.engines.simulator.kv_events import SimKvEventsPublisher

            engine.core.observe_cache(SimKvEventsPublisher(a.kv_events_config))
        server = SimServer(
            engine,
            incremental_output=a.incremental_streaming_output,
            enable_priority_scheduling=a.enable_priority_scheduling,
        )
        server.faults.garble_after_chunks = a.fault_garble_after_chunks
        server.faults.stall_after_chunks = a.fault_stall_after_chunks
        await serve_forever(server, a.host, a.port, announce=a.announce)

    asyncio.run(run())


if __name__ == "__main__":
    main()
