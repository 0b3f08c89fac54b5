"""The processes a gateway bench starts beside the gateways it measures:
`fairgate sim-server` workers, smg in front of them, a throwaway redis-server."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO

import aiohttp

from fairgate.bench.common import child_server, free_port, reap
from fairgate.bench.redis_local import RedisServer, throwaway_redis


@contextmanager
def local_redis(wanted: bool) -> Iterator[RedisServer | None]:
    """A throwaway redis-server for the variants that share state through one."""
    if not wanted:
        yield None
        return
    with throwaway_redis("a store=redis variant") as server:
        yield server


def find_smg(explicit: str) -> str | None:
    """The smg binary: `explicit`, else beside this Python, else on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).with_name("smg")
    return str(beside) if beside.exists() else shutil.which("smg")


@asynccontextmanager
async def sim_workers(
    n: int, time_scale: float, max_running: int, incremental: bool = False
) -> AsyncIterator[list[str]]:
    args = [
        "--announce",
        "--port=0",
        f"--time-scale={time_scale}",
        f"--max-running-requests={max_running}",
        "--kv-capacity-tokens=4000000",
    ]
    if incremental:
        args.append("--incremental-streaming-output")
    async with AsyncExitStack() as stack:
        urls = []
        for _ in range(n):
            server = await stack.enter_async_context(
                child_server("service.engines.simulator.http_server", *args)
            )
            urls.append(f"http://{server.address}")
        yield urls


@asynccontextmanager
async def smg_gateway(
    binary: str, worker_urls: Sequence[str], policy: str = "round_robin"
) -> AsyncIterator[tuple[str, int]]:
    with tempfile.TemporaryFile() as log:  # its errors, shown if it exits
        async with _smg(binary, worker_urls, log, policy) as running:
            yield running


@asynccontextmanager
async def _smg(
    binary: str, worker_urls: Sequence[str], log: IO[bytes], policy: str
) -> AsyncIterator[tuple[str, int]]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        binary,
        "launch",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--policy={policy}",
        "--log-level=error",
        # Its metrics default to port 29000: another smg on the machine would hold it.
        "--prometheus-host=127.0.0.1",
        f"--prometheus-port={free_port()}",
        "--worker-urls",
        *worker_urls,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                if proc.returncode is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"smg exited with {proc.returncode}:\n{tail}")
                try:
                    async with session.get(url + "/v1/models") as r:
                        if r.status == 200 and (await r.json()).get("data"):
                            break
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("smg did not become ready in 60 s")
        yield url, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
            await reap(proc)
