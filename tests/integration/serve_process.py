"""`fairgate serve` as a child process, for tests with several server processes:
started with an environment, its addresses read from its announcement line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator

# "listening on HOST:PORT[, OpenAI API on URL] ..."
ANNOUNCED = re.compile(r"listening on ([^\s,]+)(?:, OpenAI API on (\S+))?")


async def start_serve(env: dict[str, str]) -> tuple[asyncio.subprocess.Process, str, str]:
    """The process, its gRPC address and its OpenAI API's base URL ("" when off)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairgate.cli.main", "serve", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line, "fairgate serve exited before listening"
        m = ANNOUNCED.search(line)
        if m:
            return proc, m.group(1), m.group(2) or ""


def redis_env(redis_url: str, tenants_file: str, **extra: str) -> dict[str, str]:
    """A replica's environment: this one's less any FAIRGATE_/OTEL_ setting, both
    fronts on free ports, the shared store on `redis_url` (a fresh engine domain),
    the tenants file; `extra`: FAIRGATE_* overrides."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))},
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "127.0.0.1:0",
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REDIS_DOMAIN": f"t-{uuid.uuid4().hex[:8]}",
        "FAIRGATE_TENANTS_FILE": tenants_file,
        "FAIRGATE_LOG_LEVEL": "WARNING",
        **extra,
    }


@contextlib.asynccontextmanager
async def serve_replicas(env: dict[str, str], n: int = 2) -> AsyncIterator[list[tuple[str, str]]]:
    """`n` replicas, one after the other (so one seeds the tenant store): their
    (gRPC address, OpenAI base URL); terminated on exit."""
    procs: list[asyncio.subprocess.Process] = []
    addresses = []
    try:
        for _ in range(n):
            proc, grpc_address, http_base = await start_serve(env)
            procs.append(proc)
            addresses.append((grpc_address, http_base))
        yield addresses
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            await proc.wait()
