"""Shared benchmark plumbing: server child processes and latency statistics."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager


@asynccontextmanager
async def child_server(module: str, *args: str) -> AsyncIterator[int]:
    """Run `python -m module args` until the block ends; yield the port it announces.

    The child prints `PORT <n>` when ready and exits when its stdin closes.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"{module} {' '.join(args)} failed to start: {line!r}")
        yield int(line.split()[1])
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@asynccontextmanager
async def server_process(mode: str, **settings: object) -> AsyncIterator[str]:
    """Start `fairgate.bench.servers` in a child process; yield its address."""
    args = [f"{k}={v}" for k, v in settings.items()]
    async with child_server("fairgate.bench.servers", mode, *args) as port:
        yield f"127.0.0.1:{port}"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"
