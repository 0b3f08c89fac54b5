"""`fairgate serve` as a child process, for tests with several server processes:
started with an environment, its addresses read from its announcement line."""

from __future__ import annotations

import asyncio
import re
import sys

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
