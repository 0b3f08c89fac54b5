"""Shared benchmark plumbing: server child processes and latency statistics."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ServerProcess:
    address: str
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the server has used so far (Linux)."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@asynccontextmanager
async def child_server(module: str, *args: str) -> AsyncIterator[ServerProcess]:
    """Run `python -m module args` until the block ends; yield its loopback address and pid.

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
        yield ServerProcess(f"127.0.0.1:{int(line.split()[1])}", proc.pid)
    finally:
        proc.stdin.close()
        await reap(proc)


async def reap(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> None:
    """Wait for a child asked to stop; kill it if it is still there after `timeout_s`."""
    try:
        await asyncio.wait_for(proc.wait(), timeout=timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()


def free_port() -> int:
    """A loopback port free right now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def server_child(mode: str, **settings: object) -> AsyncIterator[ServerProcess]:
    """Start `fairgate.bench.servers` in a child process; yield its address and pid."""
    args = [f"{k}={v}" for k, v in settings.items()]
    async with child_server("fairgate.bench.servers", mode, *args) as server:
        yield server


@asynccontextmanager
async def server_process(mode: str, **settings: object) -> AsyncIterator[str]:
    """Start `fairgate.bench.servers` in a child process; yield its address."""
    async with server_child(mode, **settings) as server:
        yield server.address


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"
