"""`fairgate serve --workers 2`: two server processes on one port, sharing admission
through a real Redis.

Real processes (the `fairgate serve` CLI and its workers), a real redis-server,
the real generated stubs. Which worker served a request is read on the server
side: worker i serves its own Prometheus endpoint on `metrics_listen` + i,
which counts its requests per tenant. Every request goes over a fresh
connection (a channel with its own subchannel pool): the kernel spreads
connections, not requests, across the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
import redis as redis_lib
from fairgate import AsyncClient, FairgateError
from fairgate.admin.client import AdminClient
from fairgate.bench.procstat import descendants

from tests.helpers import eventually
from tests.redis_server import free_port

PROMPT = [17] * 8
OUTPUT_TOKENS = 8
COST_TOKENS = len(PROMPT) + OUTPUT_TOKENS  # reserved at arrival, all of it used
BUDGET_REQUESTS = 10
TENANTS = f"""
tenants:
  - id: spread
  - id: web
  - id: q
    over_quota: reject
    quotas: {{tokens_per_min: 1, tokens_burst: {COST_TOKENS * BUDGET_REQUESTS}}}
"""
FRESH = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
ADMIN_TOKEN = "workers-test-admin-token"


@dataclass
class Fleet:
    proc: asyncio.subprocess.Process
    address: str
    pids: list[int]
    metrics_ports: list[int]
    output: list[str] = field(default_factory=list)
    http_url: str = ""  # the OpenAI API's base URL, when on

    async def requests_by_worker(self, tenant: str) -> list[int]:
        """Each worker's Generate calls for `tenant` (any outcome), from its /metrics."""
        counts = []
        async with aiohttp.ClientSession() as session:
            for port in self.metrics_ports:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                counts.append(
                    sum(
                        int(float(line.rsplit(" ", 1)[1]))
                        for line in text.splitlines()
                        if line.startswith("gen_ai_server_request_duration_seconds_count{")
                        and f'fairgate_tenant="{tenant}"' in line
                    )
                )
        return counts


def _metrics_base(n: int) -> int:
    """A port p with p .. p+n-1 all free (worker i serves metrics on p + i)."""
    while True:
        base = free_port()
        with contextlib.ExitStack() as stack:
            try:
                for i in range(1, n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", base + i))
            except OSError:
                continue
        return base


def _env(redis_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    return {
        **os.environ,
        "FAIRGATE_LISTEN": "127.0.0.1:0",
        "FAIRGATE_HTTP_LISTEN": "",
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
        "FAIRGATE_REDIS_DOMAIN": "workers-test",
        "FAIRGATE_SIM_TIME_SCALE": "0",
        "FAIRGATE_TENANTS_FILE": str(tenants),
        "FAIRGATE_LOG_LEVEL": "WARNING",
        "FAIRGATE_SHUTDOWN_GRACE_S": "1",
        **extra,
    }


@contextlib.asynccontextmanager
async def workers(env: dict[str, str], n: int = 2) -> AsyncIterator[Fleet]:
    base = _metrics_base(n)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "fairgate.cli.main", "serve", "--workers", str(n)),
        env={**env, "FAIRGATE_METRICS_LISTEN": f"127.0.0.1:{base}"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    output: list[str] = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line, f"supervisor exited before listening: {''.join(output)}"
        output.append(line)
        m = re.search(r"listening on ([^\s,]+)(?:, OpenAI API on (\S+))? .*pids ([\d ]+)\)", line)
        if m:
            break
    stdout = proc.stdout

    async def drain() -> None:  # keep the pipe from filling up
        while line := await stdout.readline():
            output.append(line.decode())

    reader = asyncio.create_task(drain())
    fleet = Fleet(proc, m.group(1), [int(p) for p in m.group(3).split()], [], output)
    fleet.http_url = m.group(2) or ""
    fleet.metrics_ports = [base + i for i in range(n)]
    try:
        yield fleet
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await _gone(fleet.pids)
        await reader


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


async def _gone(pids: list[int]) -> None:
    await eventually(lambda: not any(_alive(p) for p in pids), 30, "workers exited")


async def _until_both_served(
    fleet: Fleet, call: Callable[[], Awaitable[object]], tenant: str = "spread"
) -> None:
    """Calls over fresh connections until every worker has served `tenant` (at most 200)."""
    for i in range(200):
        await call()
        if i % 4 == 3 and all(await fleet.requests_by_worker(tenant)):
            return
    pytest.fail(f"not every worker served: {await fleet.requests_by_worker(tenant)}")


async def test_two_workers_share_a_port_and_a_fleet_wide_quota(
    redis_url: str, tmp_path: Path
) -> None:
    env = _env(redis_url, tmp_path, FAIRGATE_HTTP_LISTEN="127.0.0.1:0")
    async with workers(env) as fleet:
        assert fleet.http_url.startswith("http://127.0.0.1:")
        assert len(fleet.pids) == 2
        assert set(descendants(fleet.proc.pid)) == {fleet.proc.pid, *fleet.pids}

        async def spread() -> None:
            async with AsyncClient(fleet.address, tenant="spread", options=FRESH) as c:
                await c.complete(PROMPT, max_tokens=2)

        await _until_both_served(fleet, spread)

        # The OpenAI HTTP front shares its port the same way.
        async def web() -> None:
            body = {"model": "", "prompt": "hello", "max_tokens": 2}
            headers = {"x-fairgate-tenant": "web"}
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                url = fleet.http_url + "/completions"
                async with session.post(url, json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()

        await _until_both_served(fleet, web, "web")

        # Each worker is a replica of its own in Redis (heartbeats: the fail-open
        # divisor counts both), named with its pid.
        r = redis_lib.Redis.from_url(redis_url)
        try:

            def live() -> list[str]:
                return [m.decode() for m in r.zrange("fg:{workers-test}:rep", 0, -1)]

            await eventually(lambda: len(live()) == 2, 10, "two replicas' heartbeats")
            assert all(any(f"-{pid}-" in m for m in live()) for pid in fleet.pids), live()
        finally:
            r.close()

        # The quota holds for the fleet: exactly its budget of requests passes,
        # whichever worker each one reached; the rest are refused at once.
        async def quota_one() -> str:
            async with AsyncClient(fleet.address, tenant="q", options=FRESH) as c:
                try:
                    done = await c.complete(PROMPT, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
                except FairgateError as exc:
                    return exc.code.name
            usage = done.result.usage
            assert usage.prompt_tokens + usage.completion_tokens == COST_TOKENS
            return "OK"

        sent = 3 * BUDGET_REQUESTS
        outcomes = await asyncio.gather(*(quota_one() for _ in range(sent)))
        assert outcomes.count("OK") == BUDGET_REQUESTS, outcomes
        assert outcomes.count("RESOURCE_EXHAUSTED") == sent - BUDGET_REQUESTS, outcomes
        # Each call is counted as it ends on the server, a moment after its client
        # saw the end: poll until all are (bounded), then check the split.
        by_worker = await fleet.requests_by_worker("q")
        for _ in range(100):
            if sum(by_worker) >= sent:
                break
            await asyncio.sleep(0.05)
            by_worker = await fleet.requests_by_worker("q")
        assert sum(by_worker) == sent and all(by_worker), by_worker

        # SIGTERM: every worker drains and exits, then the supervisor, with 0.
        fleet.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(fleet.proc.wait(), 60) == 0
        assert not any(_alive(p) for p in fleet.pids)


async def test_workers_share_one_api_key_pepper(redis_url: str, tmp_path: Path) -> None:
    """No pepper configured: a key issued through one worker verifies on the others."""
    env = _env(redis_url, tmp_path, FAIRGATE_ADMIN_TOKEN=ADMIN_TOKEN, FAIRGATE_API_KEY_PEPPER="")
    async with workers(env) as fleet:

        def issue() -> str:
            with AdminClient(fleet.address, token=ADMIN_TOKEN) as admin:
                return admin.issue_key("spread").secret

        secret = await asyncio.to_thread(issue)

        async def with_key() -> None:
            async with AsyncClient(fleet.address, api_key=secret, options=FRESH) as c:
                await c.complete(PROMPT, max_tokens=2)

        async def until_synced() -> None:
            # The other worker loads the new key within tenant_sync_interval_s;
            # with a pepper of its own it would never verify it.
            with contextlib.suppress(FairgateError):
                await with_key()

        await _until_both_served(fleet, until_synced)
        for _ in range(8):
            await with_key()
        # Keys are now required on every worker.
        for _ in range(8):
            async with AsyncClient(fleet.address, tenant="spread", options=FRESH) as c:
                with pytest.raises(FairgateError) as refused:
                    await c.complete(PROMPT, max_tokens=2)
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_workers_need_redis() -> None:
    env = {**os.environ, "FAIRGATE_STORE": "memory", "FAIRGATE_LISTEN": "127.0.0.1:0"}
    env["FAIRGATE_HTTP_LISTEN"] = ""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "fairgate.cli.main", "serve", "--workers", "2"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "workers=2 needs store=redis" in err.decode() and "FAIRGATE_STORE" in err.decode()
    assert "listening" not in out.decode()


async def test_a_dead_worker_stops_the_node(redis_url: str, tmp_path: Path) -> None:
    """A worker that dies unexpectedly: the others drain and the supervisor exits non-zero."""
    async with workers(_env(redis_url, tmp_path)) as fleet:
        os.kill(fleet.pids[0], signal.SIGKILL)
        assert await asyncio.wait_for(fleet.proc.wait(), 60) == 1
        assert not _alive(fleet.pids[1])
    assert any("worker 0" in line and "exited unexpectedly" in line for line in fleet.output)


async def test_a_killed_supervisor_leaves_no_orphans(redis_url: str, tmp_path: Path) -> None:
    async with workers(_env(redis_url, tmp_path)) as fleet:
        fleet.proc.kill()  # no chance to forward anything: the kernel tells the workers
        await fleet.proc.wait()
        await _gone(fleet.pids)


async def test_one_server_does_not_share_a_taken_port() -> None:
    """gRPC turns SO_REUSEPORT on by default; a lone fairgate turns it off, so a second
    server on a taken port fails instead of silently taking half the connections."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "fairgate.cli.main", "serve"),
            env={**os.environ, "FAIRGATE_LISTEN": f"127.0.0.1:{port}", "FAIRGATE_HTTP_LISTEN": ""},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1, (out, err)
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in err.decode()
    assert "Traceback" not in err.decode()
