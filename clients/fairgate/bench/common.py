"""Shared benchmark plumbing: server child processes and latency statistics."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

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
async def child_server(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    python: str = "",
    start_timeout_s: float = 60.0,
) -> AsyncIterator[ServerProcess]:
    """Run `python -m module args` until the block ends; yield its loopback address and pid.

    The child prints `PORT <n>` when ready and exits when its stdin closes.
    `env`: variables added to this process's environment for the child;
    `python`: another interpreter (default: this one).
    """
    proc = await asyncio.create_subprocess_exec(
        python or sys.executable,
        "-m",
        module,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **env} if env else None,
        cwd=cwd,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), start_timeout_s)).decode()
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


def source_checkout(src: str) -> tuple[dict[str, str], str | None]:
    """Environment and working directory that make a child import fairgate
    (`clients/`, `service/`, `scheduler/`) from the checkout `src` instead of the
    installed one: PYTHONPATH comes before the editable install's finder, and the
    working directory (first on `-m`'s path) is `src`. "" → nothing changes."""
    if not src:
        return {}, None
    root = os.path.abspath(src)
    for needed in ("service", "scheduler", os.path.join("clients", "fairgate")):
        if not os.path.isdir(os.path.join(root, needed)):
            raise ValueError(f"{src}: not a fairgate checkout (no {needed}/)")
    path = [os.path.join(root, "clients"), root, os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}, root


@asynccontextmanager
async def server_child(mode: str, **settings: object) -> AsyncIterator[ServerProcess]:
    """Start `fairgate.bench.servers` in a child process; yield its address and pid.
    The key `src` (not a setting): run it from that fairgate checkout (`source_checkout`)."""
    env, cwd = source_checkout(str(settings.pop("src", "")))
    args = [f"{k}={v}" for k, v in settings.items()]
    async with child_server("fairgate.bench.servers", mode, *args, env=env, cwd=cwd) as server:
        yield server


@asynccontextmanager
async def server_process(mode: str, **settings: object) -> AsyncIterator[str]:
    """Start `fairgate.bench.servers` in a child process; yield its address."""
    async with server_child(mode, **settings) as server:
        yield server.address


_T = TypeVar("_T")


def rotated(items: Sequence[_T], rep: int) -> list[_T]:
    """`items` in repetition `rep`'s order: each repetition starts one item later,
    so that machine noise (and warm-up) falls on every item alike."""
    k = rep % len(items)
    return [*items[k:], *items[:k]]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"
