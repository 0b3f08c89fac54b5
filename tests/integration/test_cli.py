"""The `fairgate` command against a real server."""

from __future__ import annotations

import asyncio
import sys

from service.app import App

FAIRGATE = [sys.executable, "-m", "fairgate.cli.main"]


async def _run(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *FAIRGATE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_generate_streams_and_prints_usage(server: App) -> None:
    code, out, err = await _run(
        "generate", "hello from the cli", "-a", server.address, "--max-tokens", "12"
    )
    assert code == 0, err
    assert "[length]" in out
    assert "completion 12" in out
    assert "first token" in out


async def test_generate_bad_input_exits_nonzero_with_field(server: App) -> None:
    code, _, err = await _run("generate", "x", "-a", server.address, "--max-tokens", "0")
    assert code == 1
    assert "INVALID_ARGUMENT" in err and "sampling.max_tokens" in err


async def test_models_and_count_tokens(server: App) -> None:
    code, out, _ = await _run("models", "-a", server.address)
    assert code == 0 and server.models.default in out
    code, out, _ = await _run("count-tokens", "one two three", "-a", server.address)
    assert code == 0 and out.startswith("3 tokens")


async def test_health_command(server: App) -> None:
    code, out, _ = await _run("health", "-a", server.address)
    assert (code, out.strip()) == (0, "SERVING")
    await server.stop(grace_s=0)
    code, _, err = await _run("health", "-a", server.address, "--timeout", "1")
    assert code == 1 and "unhealthy" in err


async def test_serve_refuses_a_bad_tenants_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "tenants.yaml"
    bad.write_text("tenants:\n  - id: x\n    weight: -1\n")
    code, _, err = await _run("serve", "--tenants", str(bad), "--listen", "127.0.0.1:0")
    assert code == 2
    assert "tenant 'x'" in err and "weight" in err and "Traceback" not in err


async def test_bench_store_prints_both_stores(redis_url: str) -> None:
    code, out, err = await _run(
        "bench",
        "store",
        "--redis-url",
        redis_url,
        "--seconds",
        "0.3",
        "--flush-ms",
        "5",
        "--concurrency",
        "16",
    )
    assert code == 0, err
    assert "memory store" in out and "redis store, flush 5 ms" in out
    assert "round trips/req" in out
