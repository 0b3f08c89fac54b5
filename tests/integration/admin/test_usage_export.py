"""The usage log for billing (service/usage_log.py, AdminService.ExportUsage,
`fairgate admin usage-export`): two server processes on one real Redis write one
stream; a billing job that keeps its cursor in a file reads every request exactly
once, across a restart of a server and of itself. In memory mode the log is this
server's and says it is not durable."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

from tests.integration.admin.conftest import ADMIN_TOKEN
from tests.integration.serve_process import start_serve

HEADER = (("x-fairgate-tenant", "acme"),)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.terminate()  # SIGTERM: a graceful stop writes what the log still holds
    assert await proc.wait() == 0


async def _generate(address: str, request_id: str, max_tokens: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        req = pb.GenerateRequest(
            request_id=request_id, text="hello", sampling=pb.SamplingParams(max_tokens=max_tokens)
        )
        async for _ in stub.Generate(req, metadata=HEADER):
            pass


def _export(address: str, cursor_file: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "fairgate.cli.main", "admin", "usage-export", "-a", address,
         "--cursor-file", str(cursor_file), "--page", "3"],
        env={**os.environ, "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))},
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "",
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REDIS_PREFIX": f"u{uuid.uuid4().hex[:8]}",
        "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "FAIRGATE_LOG_LEVEL": "WARNING",
    }


@pytest.fixture
async def two(env: dict[str, str]) -> AsyncIterator[list[tuple[asyncio.subprocess.Process, str]]]:
    servers = [(await start_serve(env))[:2], (await start_serve(env))[:2]]
    yield servers
    for proc, _ in servers:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def test_every_request_once_across_replicas_and_restarts(
    env: dict[str, str], two: list[tuple[asyncio.subprocess.Process, str]], tmp_path: Path
) -> None:
    (proc_a, a), (_, b) = two
    cursor_file = tmp_path / "cursor"
    first = {f"r{i}": i % 5 + 1 for i in range(8)}
    await asyncio.gather(
        *(_generate((a, b)[i % 2], rid, n) for i, (rid, n) in enumerate(first.items()))
    )
    await asyncio.sleep(0.5)  # the writers' batches (50 ms)
    got = await asyncio.to_thread(_export, b, cursor_file)
    assert sorted(r["request_id"] for r in got) == sorted(first)
    for r in got:
        assert r["tenant_id"] == "acme" and r["completion_tokens"] == first[str(r["request_id"])]
        assert r["finish_reason"] == "length" and int(str(r["prompt_tokens"])) > 0
    assert cursor_file.read_text().strip() == got[-1]["cursor"]

    # A server restarts; more requests, through the restarted one and the other.
    await _stop(proc_a)
    proc_c, c, _ = await start_serve(env)
    try:
        second = {f"s{i}": 2 for i in range(5)}
        for i, rid in enumerate(second):
            await _generate((c, b)[i % 2], rid, 2)
        await asyncio.sleep(0.5)
        # The billing job runs again from its cursor file: only the new ones, once.
        again = await asyncio.to_thread(_export, c, cursor_file)
        assert sorted(r["request_id"] for r in again) == sorted(second)
        assert await asyncio.to_thread(_export, c, cursor_file) == []
    finally:
        await _stop(proc_c)


async def test_the_in_memory_log_says_it_is_not_durable(
    env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "FAIRGATE_STORE": "memory"}
    proc, address, _ = await start_serve(env)
    try:
        await _generate(address, "m1", 3)
        await asyncio.sleep(0.1)
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "fairgate.cli.main", "admin", "usage-export", "-a", address,
             "--format", "csv"],
            env={**os.environ, "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        lines = done.stdout.splitlines()
        assert lines[0].startswith("cursor,request_id,tenant_id") and len(lines) == 2
        assert ",m1,acme," in lines[1] and "memory only" in done.stderr
    finally:
        await _stop(proc)
